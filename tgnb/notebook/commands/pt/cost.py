"""``%tg pt cost [--resource ID]``: `Resource.cost()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "GPU-minutes READY and their price so far."


def arguments(p: Parser) -> None:
    p.add_argument("--resource", type=name_arg, help="another resource id")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    c = tg.pt_state().current(args.resource).cost()
    row = (
        c.resource_id,
        f"{c.minutes:.1f} {c.unit}",
        str(c.gpus),
        f"{c.gpu_minutes:.1f}",
        f"{c.price_per_hour:.2f} {c.currency}/h",
        f"{c.amount:.2f} {c.currency}" + (" (est.)" if c.estimated else ""),
    )
    head = ("RESOURCE", "READY", "GPUS", "GPU-MINUTES", "PRICE", "COST SO FAR")
    return Table(head, [row], caption=f"minutes and cost in {c.clock_note}")
