"""``%tg pt resources [--all]``: `PostTraining.resources()`, each with its GPUs, its hourly price
and what it has cost so far (`Resource.cost()`), and their total: a Model Resource bills from
READY until it stops, whatever runs on it, so every one left running is in sight. A resource
tgnb created whose process is gone is marked ``(leftover)`` and the caption says how to stop
them (`tgnb.ptregistry`: ``tgnb pt stop --leftovers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.commands.pt import when
from tgnb.notebook.tables import Table
from tgnb.prices import money

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--all", action="store_true", help="also stopped ones")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    tz = tg.timezone
    pt = tg.pt_state().handle()
    rows, total, currency, notes = [], 0.0, "", set()
    left = {x.resource_id for x in pt.leftovers()}
    for r in pt.resources(all=args.all):
        c = pt.attach(r.id).cost()
        total += c.amount
        currency = c.currency
        notes.add(c.clock_note)
        rows.append(
            (
                r.id,
                r.base_model,
                r.status
                + (f" (queue {r.queue_position})" if r.queue_position else "")
                + (" (leftover)" if r.id in left else ""),
                "LoRA" if r.lora_enabled else "full",
                str(r.generators),
                str(c.gpus),
                f"{money(c.price_per_hour, c.currency)}/h",
                money(c.amount, c.currency) + (" (est.)" if c.estimated else ""),
                when(r.created_at, tz),
                when(r.expires_at, tz),
            )
        )
    head = (
        "RESOURCE",
        "MODEL",
        "STATUS",
        "KIND",
        "GENERATORS",
        "GPUS",
        "PRICE",
        "COST SO FAR",
        "CREATED",
        "EXPIRES",
    )
    caption = f"{len(rows)} resource(s), {money(total, currency or 'USD')} so far; minutes in " + (
        ", ".join(sorted(notes))
    )
    if left:
        from tgnb.ptregistry import STOP_HINT

        caption += (
            f"; {len(left)} leftover(s), left running by processes that are gone: "
            f"{STOP_HINT} stops them"
        )
    return Table(head, rows, "no model resources: %tg pt start MODEL", caption if rows else "")
