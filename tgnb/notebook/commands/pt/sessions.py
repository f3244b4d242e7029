"""``%tg pt sessions [--active] [--resource ID]``: `Resource.sessions()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg
from tgnb.notebook.commands.pt import when
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--resource", type=name_arg, help="another resource id")
    p.add_argument("--active", action="store_true", help="only running ones")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    rows = [
        (
            s.id,
            s.name or "-",
            s.status,
            str(s.step),
            str(s.policy_version),
            f"r{s.lora_rank}" if s.lora_rank else "full",
            str(len(s.checkpoints)),
            when(s.created_at, tg.timezone),
        )
        for s in tg.pt_state().current(args.resource).sessions(active=args.active)
    ]
    head = ("SESSION", "NAME", "STATUS", "STEP", "POLICY", "LORA", "CKPTS", "CREATED")
    return Table(head, rows, "no sessions: %tg pt open --rank 8")
