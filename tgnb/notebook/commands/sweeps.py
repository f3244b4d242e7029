"""``%tg sweeps [--all]``: the sweeps of the attached cluster (every one in the run store with
``--all``), one line each: its runs by state, its dollars so far, its best run
(`tgnb.runs.sweeps.Sweep`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.tables import Table
from tgnb.prices import dollars

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--all", action="store_true", help="every sweep of the run store")


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    from tgnb.runs.sweeps import best_run

    rows = []
    for sweep in tg.attached().sweeps(all_clusters=args.all):
        table = sweep.rows()
        states = ", ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items())) or "-"
        known = [r.cost_usd for r in table if r.cost_usd is not None]
        best = best_run(table, sweep.mode)
        row = next((r for r in table if r.run == best), None)
        said = row.cells()[-1] if row is not None else "-"
        rows.append(
            (
                sweep.name,
                sweep.record.source or "-",
                str(len(sweep)),
                states,
                dollars(sum(known)) if known else dollars(None),
                f"{best}: {said}" if best else "-",
            )
        )
    scope = "every cluster" if args.all else "the attached cluster"
    empty = (
        f"no sweeps on {scope} yet: session.map(fn, items), or session.sweep(name, runs) for a "
        "grid of launches"
    )
    head = ("SWEEP", "FROM", "RUNS", "STATES", "COST", "BEST")
    return Table(head, rows, empty, f"sweeps of {scope}: %tg sweep NAME shows one")
