"""``%tg stop RUN``: `Run.stop()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("run", type=name_arg, help="run name or id")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    target = tg.find_run(args.run)
    target.stop()
    print(f"stop requested for run {target.name}")
