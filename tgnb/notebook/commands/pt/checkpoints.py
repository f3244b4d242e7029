"""``%tg pt checkpoints [--resource ID]``: `Resource.checkpoints()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg
from tgnb.notebook.commands.pt import when
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--resource", type=name_arg, help="another resource id")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    rows = [
        (c.id, c.kind, c.session_id, str(c.step), when(c.created_at, tg.timezone))
        for c in tg.pt_state().current(args.resource).checkpoints()
    ]
    head = ("CHECKPOINT", "KIND", "SESSION", "STEP", "CREATED")
    return Table(head, rows, "no checkpoints: %tg pt save SESSION")
