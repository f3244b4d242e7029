"""``%tg pt cost [--resource ID]``: `Resource.cost()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--resource", type=name_arg, help="another resource id")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    from tgnb.prices import money

    c = tg.pt_state().current(args.resource).cost()
    est = " (est.)" if c.estimated else ""
    row = (
        c.resource_id,
        f"{c.minutes:.1f} {c.unit}",
        str(c.gpus),
        f"{c.gpu_minutes:.1f}",
        f"{money(c.price_per_hour, c.currency)}/h",
        money(c.amount, c.currency) + est,
    )
    rows = [row] + [
        (f"  session {label}", "", "", "", "", money(amount, c.currency) + est)
        for label, amount in c.sessions
    ]
    head = ("RESOURCE", "READY", "GPUS", "GPU-MINUTES", "PRICE", "COST SO FAR")
    caption = f"minutes and cost in {c.clock_note}"
    if c.sessions:
        caption += "; a session's cost: the resource's, split by the time each session was open"
    return Table(head, rows, caption=caption)
