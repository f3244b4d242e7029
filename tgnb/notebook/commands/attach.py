"""``%tg attach [CLUSTER] [--local] [--time-scale X]``: `tgnb.session.attach`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg, number

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument(
        "cluster", nargs="?", type=name_arg, help="cluster name or id (default: Tg.default_cluster)"
    )
    p.add_argument(
        "--local", action="store_true", help="use the local emulator, start it if needed"
    )
    p.add_argument(
        "--time-scale",
        type=number,
        default=None,
        help="the local emulator's time scale (default: the running one's, else 0.02)",
    )


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    from tgnb.session import attach

    target = args.cluster or tg.default_cluster or None
    local = args.local or None  # no --local: the key decides (tgnb.attach's default)
    session = tg.session = attach(target, local=local, time_scale=args.time_scale)
    if session.emulator is not None:
        print(f"attached to the local emulator at {session.cloud.base_url}")
    return session
