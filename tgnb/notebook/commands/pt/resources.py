"""``%tg pt resources [--all]``: `PostTraining.resources()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.commands.pt import when
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "This project's model resources (active ones unless --all)."


def arguments(p: Parser) -> None:
    p.add_argument("--all", action="store_true", help="also stopped ones")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    tz = tg.timezone
    rows = [
        (
            r.id,
            r.base_model,
            r.status + (f" (queue {r.queue_position})" if r.queue_position else ""),
            "LoRA" if r.lora_enabled else "full",
            str(r.generators),
            when(r.created_at, tz),
            when(r.expires_at, tz),
        )
        for r in tg.pt_state().handle().resources(all=args.all)
    ]
    head = ("RESOURCE", "MODEL", "STATUS", "KIND", "GENERATORS", "CREATED", "EXPIRES")
    return Table(head, rows, "no model resources: %tg pt start MODEL")
