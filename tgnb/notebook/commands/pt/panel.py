"""``%tg pt panel`` (or ``%tg pt watch``) ``[--resource ID]``: a live `ResourcePanel`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--resource", type=name_arg, help="another resource id")


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    from tgnb.notebook.pt_panel import ResourcePanel

    return ResourcePanel(tg.pt_state().current(args.resource), poll_interval=tg.poll_interval)
