"""``%tg status``: `Session.status()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    pass


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    return tg.attached().status()
