"""``%tg watch RUN``: a live `RunPanel` of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "Show a live RunPanel."


def arguments(p: Parser) -> None:
    p.add_argument("run", type=name_arg, help="run name or id")


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    from tgnb.notebook.widgets import RunPanel

    panel = RunPanel(tg.find_run(args.run), poll_interval=tg.poll_interval)
    if not tg.in_kernel:
        return panel  # no front end to update: the caller shows it
    panel.show()  # displayed, not returned: its fallback is kept current after each cell
    return None
