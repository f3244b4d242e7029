"""``%tg pt start MODEL [--generators N] [--inactive-timeout 15m] [--full-weight] [-o NAME]``:
`PostTraining.start` (it checks the model, the generators and the timeout's range)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, at_least_zero, duration, out_name

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

STORES = True


def arguments(p: Parser) -> None:
    p.add_argument("model", help="base model, e.g. tgnb/tiny-llama (see %%tg pt models)")
    p.add_argument(
        "--generators", type=at_least_zero, default=1, help="generator replicas (0: none)"
    )
    p.add_argument(
        "--inactive-timeout",
        type=duration,
        default=None,
        help="stop after idling this long, e.g. 30m (default 15m, $TGNB_PT_INACTIVE_TIMEOUT)",
    )
    p.add_argument("--full-weight", action="store_true", help="one full-weight session, no LoRA")
    p.add_argument(
        "-o", "--out", type=out_name, metavar="NAME", help="store the Resource under NAME"
    )


def run(tg: Tg, args: Any, cell: str | None) -> None:
    timeout = args.inactive_timeout
    state = tg.pt_state()
    res = state.handle().start(
        args.model,
        generators=args.generators,
        inactive_timeout=None if timeout is None else int(timeout.total_seconds()),
        lora=not args.full_weight,
    )
    state.resource = res
    tg.store(args.out, res)
    info = res.info()
    print(
        f"model resource {res.id} {info.status} ({info.base_model}, {info.generators} generator(s);"
        f" stops itself after {info.inactive_timeout} s without an operation)"
    )
