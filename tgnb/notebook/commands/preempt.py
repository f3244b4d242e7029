"""``%tg preempt [NODE]``: `Session.preempt` (emulator only: the Session refuses, sending nothing,
elsewhere)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "Preempt a node now (local emulator only)."


def arguments(p: Parser) -> None:
    p.add_argument(
        "node", nargs="?", type=name_arg, help="node name (default: the oldest preemptible node)"
    )


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    return tg.attached().preempt(args.node)
