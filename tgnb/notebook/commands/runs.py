"""``%tg runs [--all]``: the runs this notebook launched or opened (``--all``: the cluster's) as a
table of their state, steps, nodes, restarts, dollars so far and what the cockpit notes (an
unprotected program, a stop without a checkpoint)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.tables import Table, scope_words
from tgnb.prices import dollars

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg
    from tgnb.runs import Run


def arguments(p: Parser) -> None:
    p.add_argument("--all", action="store_true", help="every run of the attached cluster")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    return runs_table(tg.notebook_runs(args.all), every=args.all, others=tg.others(args.all))


def runs_table(runs: Iterable[Run], every: bool = True, others: int = 0) -> Table:
    rows = []
    for r in runs:
        st = r.report()  # the engine's word (an error it gave is in its detail)
        rec = r.record
        summary = r.summary()  # steps as the program logged them, against its own max steps
        total = summary["max_steps"]
        rows.append(
            (
                rec.name,
                summary["kind"],
                st.state.value,
                f"{summary['steps']}/{total}" if total else str(summary["steps"]),
                rec.backend,
                ",".join(st.nodes) or "-",
                str(st.restart_count),
                dollars(summary["cost_usd"]),
                summary["note"] or "",
            )
        )
    if every:
        empty = "no runs on this cluster yet: %tg launch grpo"
    else:
        more = f" ({others} on the cluster: %tg runs --all)" if others else ""
        empty = f"no runs launched or opened in this notebook yet: %tg launch grpo{more}"
    head = ("RUN", "KIND", "STATE", "STEPS", "BACKEND", "NODES", "RESTARTS", "COST", "NOTE")
    return Table(head, rows, empty, scope_words(every, others))
