"""``%tg pt save SESSION [--kind inference|training] [--resource ID]``: `TrainingSession.save`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("session", type=name_arg, metavar="ID_OR_NAME", help="the session")
    p.add_argument("--kind", choices=["inference", "training"], default="inference")
    p.add_argument("--resource", type=name_arg, help="another resource id")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    c = tg.pt_state().current(args.resource).session(args.session).save(args.kind)
    print(f"{c.kind} checkpoint {c.id} at step {c.step}")
