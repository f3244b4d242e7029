"""A run's ``budget_usd``: what it has cost so far against its budget, and what is due.

One rule for every engine (`check`): the run's GPU-hours from its events (`tgnb.runs.cost`) at
the prices of its launch; a ``BudgetNotice`` once at `tgnb.prices.NOTICE_FRACTION` of the budget,
and at the budget a ``BudgetReached`` and the stop a cancel makes (SIGTERM: the run checkpoints,
then it is cancelled). Who applies it:

- the local engine's supervisor, at each tick of its loop, beside the run
  (`tgnb.backends.local.supervisor`);
- Slurm and Kubernetes runs have no process of tgnb's beside them on the cluster, so their
  watcher does, at each poll: `tgnb.runs.Run.wait`, which ``%tg watch --wait`` and
  `tgnb.sweep.wait` call. There the budget holds while something waits for the run (a notebook
  kernel, a papermill run); a run nobody waits for runs past it until the next wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tgnb.events import BUDGET_NOTICE, BUDGET_REACHED, Event
from tgnb.prices import NOTICE_FRACTION, dollars
from tgnb.runs.cost import run_cost
from tgnb.runs.spec import RunSpec


@dataclass(frozen=True)
class BudgetCheck:
    """A run's dollars so far against its budget, and the events now due (reason, message)."""

    spent_usd: float
    budget_usd: float
    due: tuple[tuple[str, str], ...]

    @property
    def reached(self) -> bool:
        return self.spent_usd >= self.budget_usd

    @property
    def stop_reason(self) -> str:
        return f"budget reached: spent {self.of}"

    @property
    def of(self) -> str:
        return f"{dollars(self.spent_usd)} of its {dollars(self.budget_usd)} budget"

    @property
    def data(self) -> dict[str, Any]:
        """The data of its events: ``spent_usd``, ``budget_usd``."""
        return {"spent_usd": round(self.spent_usd, 6), "budget_usd": self.budget_usd}


def check(spec: RunSpec, events: Sequence[Event]) -> BudgetCheck | None:
    """The run's budget as its `events` say (None: no budget, or no prices). The notice is due
    once; it comes first, however late it is seen. ``BudgetReached`` is due once its events lack
    it."""
    if spec.budget_usd is None or spec.prices is None:
        return None
    gpus = int(spec.resources.gpus_per_node) * int(spec.resources.nodes)
    spent = run_cost(spec.name, events, gpus).dollars(spec.prices) or 0.0
    now = BudgetCheck(spent, spec.budget_usd, ())
    said = {e.reason for e in events}
    due: list[tuple[str, str]] = []
    if spent >= NOTICE_FRACTION * now.budget_usd and BUDGET_NOTICE not in said:
        pct = round(NOTICE_FRACTION * 100)
        due.append((BUDGET_NOTICE, f"{pct} % of the budget spent: {now.of}; stopped at the budget"))
    if now.reached and BUDGET_REACHED not in said:
        due.append((BUDGET_REACHED, f"spent {now.of}: stopping the run (it checkpoints)"))
    return replace(now, due=tuple(due))


__all__ = ["BudgetCheck", "check"]
