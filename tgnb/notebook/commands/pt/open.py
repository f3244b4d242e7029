"""``%tg pt open [--rank R] [--alpha A] [--dropout D] [--seed S] [--name N] [--resume CKPT]
[--resource ID] [-o NAME]``: `Resource.open_session` (it checks the LoRA config against the
model's own rank range, and the name)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import (
    Parser,
    at_least_zero,
    name_arg,
    number,
    out_name,
    signed_whole,
)

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

STORES = True


def arguments(p: Parser) -> None:
    p.add_argument(
        "--rank", type=signed_whole, help="LoRA rank, e.g. 8 (%%tg pt models: its maximum)"
    )
    p.add_argument("--alpha", type=number, help="LoRA alpha, e.g. 16 (a float too)")
    p.add_argument("--dropout", type=number, help="LoRA dropout, e.g. 0.05")
    p.add_argument("--seed", type=at_least_zero, help="LoRA init seed")
    p.add_argument("--name", help="display name, e.g. lr-1e-4")
    p.add_argument("--resume", metavar="CHECKPOINT", help="training checkpoint id to resume")
    p.add_argument("--resource", type=name_arg, help="another resource id")
    p.add_argument(
        "-o", "--out", type=out_name, metavar="NAME", help="store the TrainingSession under NAME"
    )


def run(tg: Tg, args: Any, cell: str | None) -> None:
    lora = {
        k: getattr(args, k)
        for k in ("rank", "alpha", "dropout", "seed")
        if getattr(args, k) is not None
    }
    state = tg.pt_state()
    if state.resource is None or args.resource not in (None, state.resource.id):
        # Another resource is attached first (a request): what can be checked without it is
        # checked before it (the rank's range is the service's, when the session is opened).
        from tgnb.posttraining import validate

        validate.check_lora(lora)
        validate.check_name(args.name)
    res = state.current(args.resource)
    sess = res.open_session(lora=lora or None, name=args.name, resume_from=args.resume)
    tg.store(args.out, sess)
    label = f" {sess.name!r}" if sess.name else ""
    print(f"session {sess.id}{label} RUNNING on {res.id}")
