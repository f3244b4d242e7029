"""``%tg logs RUN [-f] [--raw]``: `Run.logs()`, or with ``-f`` `Run.logs(follow=True)`: the run's
output across its attempts, each after a header line, until the run ends or an interrupt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

USAGE = "%(prog)s RUN [-f] [--raw]"


def arguments(p: Parser) -> None:
    p.add_argument("run", nargs="?", type=name_arg, help="run name or id")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing until the run ends, each attempt after a header (Ctrl-C: stop)",
    )
    p.add_argument("--raw", action="store_true", help="tgnb's @tgnb record lines too")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    if args.run is None:
        raise UsageError(
            "name the run: %tg logs RUN (-f to follow it until it ends); %tg runs lists them"
        )
    target = tg.find_run(args.run)
    if args.follow:
        target.logs(raw=args.raw, follow=True)
        return
    print("\n".join(target.logs(raw=args.raw)))
