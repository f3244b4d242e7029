"""A sweep's budget: wait for a sweep's runs with one ``budget_usd`` over all of them.

A sweep raises the preemptible target, launches its runs and waits for them (the GRPO sweep
notebook). `wait` is that wait with a budget: at each poll the runs are priced (`tgnb.runs.Run.cost`
at `tgnb.runs.Run.prices`: the cluster's dollars per GPU-hour); at `tgnb.prices.NOTICE_FRACTION` of
the budget one notice is printed; at the budget every unfinished run is stopped as ``run.stop()``
does (its processes checkpoint) and the preemptible target is dropped to `target_after`, so the
sweep's nodes stop billing. Works on every engine: it runs in the process that waits (a notebook
kernel, a papermill run), not on the cluster; a run's own ``budget_usd`` is `tgnb.runs.budget`'s.

The sweep as one object, `Sweep` (``session.map``, ``session.sweep(name, runs)``: its table,
chart and stop, kept in the run store), is `tgnb.runs.sweeps.Sweep`, re-exported here: it lives
with the runs because `Session.map` returns one and the session sits below this module; its
chart is `tgnb.notebook.sweep_view`'s, which ``%load_ext tgnb`` makes its HTML. A `Sweep` is a
sequence of runs, so `wait` takes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tgnb.errors import ValidationError
from tgnb.prices import NOTICE_FRACTION, check_budget, dollars
from tgnb.runs.sweeps import Sweep

if TYPE_CHECKING:
    from tgnb.runs import Run
    from tgnb.session import Session


@dataclass(frozen=True)
class SweepOutcome:
    """How a sweep's wait ended: its dollars, whether the budget stopped it, the target left."""

    spent_usd: float
    budget_usd: float
    stopped: bool
    target: int | None

    def __str__(self) -> str:
        what = (
            f"stopped at the budget; preemptible target dropped to {self.target}"
            if self.stopped
            else "finished within the budget"
        )
        return f"sweep: {dollars(self.spent_usd)} of {dollars(self.budget_usd)}, {what}"

    __repr__ = __str__


def spent(runs: Sequence[Run]) -> float:
    """The dollars of `runs` so far at their prices (a run with no known price counts 0)."""
    return sum(r.cost().dollars(r.prices()) or 0.0 for r in runs)


def wait(
    session: Session,
    runs: Sequence[Run],
    budget_usd: float,
    *,
    target_after: int = 0,
    poll: float = 1.0,
    timeout: float | None = None,
    say: Callable[[str], object] = print,
) -> SweepOutcome:
    """Wait until every run of `runs` has finished, or their dollars reach `budget_usd`: then
    stop them (they checkpoint) and set the preemptible target to `target_after` (a multiple of
    8). A `ValidationError` before anything is done for a bad budget or target, or a cluster
    whose prices are not known (``%config Tg.*_price``); `TimeoutError` after `timeout` s."""
    budget = check_budget(budget_usd)
    if budget is None:
        raise ValidationError("budget_usd must be a number of dollars: e.g. budget_usd=25")
    if isinstance(target_after, bool) or not isinstance(target_after, int) or target_after < 0:
        raise ValidationError(
            f"target_after must be a GPU count >= 0, got {target_after!r:.40}: e.g. target_after=0"
        )
    if any(r.prices() is None for r in runs):
        raise ValidationError(
            "the cluster's prices per GPU-hour are not known: launch the runs with prices= "
            "(tgnb.prices.Prices) or set %config Tg.standard_price and Tg.preemptible_price"
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    noticed = False
    while True:
        finished = all(r.sync().state.finished for r in runs)
        usd = spent(runs)
        if finished:
            return SweepOutcome(usd, budget, False, None)
        if usd >= NOTICE_FRACTION * budget and not noticed:
            noticed = True
            say(
                f"sweep: {round(NOTICE_FRACTION * 100)} % of the budget spent ({dollars(usd)} of "
                f"{dollars(budget)}): stopped, and the preemptible target dropped, at the budget"
            )
        if usd >= budget:
            for r in runs:
                r.stop()
            for r in runs:  # each checkpoints first: scaling down removes the nodes at once
                r.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 1))
            session.scale(preemptible=target_after)
            say(
                f"sweep: budget reached ({dollars(usd)} of {dollars(budget)}): runs stopped "
                f"(they checkpoint), preemptible target dropped to {target_after}"
            )
            return SweepOutcome(spent(runs), budget, True, target_after)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the sweep is still running after {timeout:g} s")
        time.sleep(poll)


__all__ = ["Sweep", "SweepOutcome", "spent", "wait"]
