"""``%tg pt models``: `PostTraining.models()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    pass


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    rows = [
        (
            m.name,
            "yes" if m.lora else "no",
            str(m.max_lora_rank or "-"),
            "yes" if m.full else "no",
            str(m.max_seq_length or "-"),
            m.gpu_type,
        )
        for m in tg.pt_state().handle().models()
    ]
    head = ("MODEL", "LORA", "MAX RANK", "FULL WEIGHT", "MAX SEQ", "GPU")
    return Table(head, rows, "no supported models")
