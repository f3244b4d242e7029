"""``%tg pt attach RESOURCE_ID [-o NAME]``: `PostTraining.attach`, made the current resource."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg, out_name

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

STORES = True


def arguments(p: Parser) -> None:
    p.add_argument("resource", type=name_arg, help="resource id (see %%tg pt resources)")
    p.add_argument(
        "-o", "--out", type=out_name, metavar="NAME", help="store the Resource under NAME"
    )


def run(tg: Tg, args: Any, cell: str | None) -> None:
    state = tg.pt_state()
    res = state.current(args.resource)
    info = res.info()
    state.resource = res
    tg.store(args.out, res)
    print(f"current model resource: {res.id} {info.status} ({info.base_model})")
