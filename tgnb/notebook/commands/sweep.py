"""``%tg sweep NAME [--stop] [-o VAR]``: one sweep as one object: its table (state, steps, lost,
preemptions, cost, best metric per run) over one chart of the runs' curves with their
preemptions (`tgnb.notebook.sweep_view.SweepView`); ``--stop`` stops every unfinished run
(each checkpoints); ``-o VAR`` stores the `tgnb.runs.sweeps.Sweep`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg, out_name

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

STORES = True


def arguments(p: Parser) -> None:
    p.add_argument("sweep", type=name_arg, help="the sweep's name (%%tg sweeps lists them)")
    p.add_argument("--stop", action="store_true", help="stop every unfinished run of the sweep")
    p.add_argument("-o", "--out", type=out_name, metavar="NAME", help="store the Sweep under NAME")


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    from tgnb.notebook.sweep_view import SweepView

    sweep = tg.attached().sweep(args.sweep)
    tg.store(args.out, sweep)
    for r in sweep:
        tg.remember(r)  # its runs count among this notebook's (%tg runs, %tg cost)
    if args.stop:
        stopped = sweep.stop()
        print(
            f"stop requested for {len(stopped)} run(s) of sweep {sweep.name}: {', '.join(stopped)}"
            if stopped
            else f"every run of sweep {sweep.name} has already finished: nothing to stop"
        )
        return None
    return SweepView(sweep)
