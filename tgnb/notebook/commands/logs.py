"""``%tg logs RUN [-f]``: `Run.logs()`, or `Run.follow()` until the run ends or an interrupt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "Print a run's log."


def arguments(p: Parser) -> None:
    p.add_argument("run", type=name_arg, help="run name or id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    target = tg.find_run(args.run)
    if not args.follow:
        print("\n".join(target.logs()))
        return
    try:
        for line in target.follow(poll=min(tg.poll_interval, 0.5)):
            print(line, flush=True)
    except KeyboardInterrupt:
        print("(stopped following; the run goes on)")
