"""``%tg pt connect [--local | --remote]``: `tgnb.posttraining.post_training`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "Use the local emulator (default) or the real service (TOGETHER_API_KEY)."


def arguments(p: Parser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", dest="remote", action="store_false", default=False)
    where.add_argument("--remote", dest="remote", action="store_true")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    state = tg.pt_state()
    pt = state.handle(remote=args.remote)
    state.resource = None
    print(f"Post-Training: {pt.conn.where} at {pt.conn.base_url}")
