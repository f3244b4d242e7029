"""``%tg certify train.py [--budget 15m] [--seed N] [--nodes N --min-nodes M]
[--fault-tolerance torchft] [-- ARGS...]``: `Session.certify` (the local
emulator only: the Session refuses elsewhere), showing the certificate."""

from __future__ import annotations

import shlex
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.errors import ValidationError
from tgnb.notebook.commands.grammar import Parser, duration

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

USAGE = (
    "%(prog)s SCRIPT [--workdir DIR] [--budget 15m] [--seed N] [--nodes 2 --min-nodes 1] "
    "[--fault-tolerance torchft] [-- ARGS...]"
)


def arguments(p: Parser) -> None:
    p.add_argument("script", help="the script, in the workdir (train.py)")
    p.add_argument("--workdir", help="the program's folder (default: the notebook's)")
    p.add_argument("--command", help="a command instead of the script, e.g. 'python t.py'")
    p.add_argument("--budget", type=duration, default=timedelta(minutes=15),
                   help="time budget, e.g. 10m (default 15m)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="seed of the random step events")
    p.add_argument("--nodes", type=int, default=1, help="nodes it runs on (default 1)")
    p.add_argument("--min-nodes", type=int, default=None, help="fewest it may shrink to")
    p.add_argument("--fault-tolerance", choices=("torchft",), default=None,
                   help="run the nodes as TorchFT replica groups (--nodes 2 or more)")  # fmt: skip
    p.add_argument("args", nargs="*", help="the script's arguments, after --")


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    session = tg.attached()
    try:
        command = shlex.split(args.command) if args.command else None
    except ValueError as exc:  # "No closing quotation"
        raise UsageError(
            f"--command {args.command!r:.80} cannot be split as a shell would: {exc} "
            "(close the quote, e.g. --command \"python 'ok.py'\")"
        ) from None
    try:
        return session.certify(
            None if args.command else args.script,
            args=list(args.args) or None,
            command=command,
            workdir=args.workdir,
            seed=args.seed,
            budget_s=args.budget.total_seconds(),
            nodes=args.nodes,
            min_nodes=args.min_nodes,
            fault_tolerance=args.fault_tolerance,
        )
    except ValidationError as exc:
        raise UsageError(str(exc)) from None
