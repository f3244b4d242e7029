"""``%tg preempt [NODE] [--timeout 15m]``: `Session.preempt` (emulator only: the Session refuses,
sending nothing, elsewhere). With no node, the node of this notebook's latest run, once the run is
placed and has trained a step (with no unfinished run here, the oldest preemptible node)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.notebook.commands.grammar import Parser, duration, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument(
        "node",
        nargs="?",
        type=name_arg,
        help="node name (default: the node of this notebook's latest unfinished run, once it "
        "has trained a step; with none, the oldest preemptible node)",
    )
    p.add_argument(
        "--timeout",
        type=duration,
        default=timedelta(minutes=15),
        help="how long to wait for the run to train a step, e.g. 5m (default 15m)",
    )


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    session = tg.attached()
    if args.node is not None:
        return session.preempt(args.node)
    going = [r for r in tg.notebook_runs(False) if not r.state.finished]
    if not going:
        return session.preempt()
    try:
        return session.preempt(run=going[-1], timeout=args.timeout.total_seconds())
    except TimeoutError as exc:
        raise UsageError(f"{exc}: wait longer (--timeout 1h) or name a node") from None
