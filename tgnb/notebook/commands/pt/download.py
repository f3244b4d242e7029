"""``%tg pt download CHECKPOINT [--variant adapter|merged] [--out DIR]``: `PostTraining.download`
(it checks the id, the variant and the directory before anything is sent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("checkpoint", type=name_arg, help="checkpoint id (see %%tg pt checkpoints)")
    p.add_argument("--variant", default="adapter", help="adapter (default) or merged")
    p.add_argument("--out", default=".", metavar="DIR", help="directory (default: .)")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    pt = tg.pt_state().handle()
    for path in pt.download(args.checkpoint, variant=args.variant, out=args.out):
        print(path)
