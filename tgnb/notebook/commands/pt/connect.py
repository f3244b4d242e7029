"""``%tg pt connect [--local | --remote]``: `tgnb.posttraining.post_training`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", dest="local", action="store_const", const=True, default=None)
    where.add_argument("--remote", dest="local", action="store_const", const=False)


def run(tg: Tg, args: Any, cell: str | None) -> None:
    state = tg.pt_state()
    pt = state.handle(local=args.local, fresh=True)
    state.resource = None
    print(f"Post-Training: {pt.conn.where} at {pt.conn.base_url}")
