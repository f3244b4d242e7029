"""A run's ``budget_usd``: what it has cost so far against its budget, and what is due.

One rule for every engine (`check`): the run's GPU-hours from its events (`tgnb.runs.cost`) at
the prices of its launch; a ``BudgetNotice`` once at `tgnb.prices.NOTICE_FRACTION` of the budget,
and at the budget a ``BudgetReached`` and the stop a cancel makes (SIGTERM: the run checkpoints,
then it is cancelled). Who applies it:

- the local engine's supervisor, at each tick of its loop, beside the run
  (`tgnb.backends.local.supervisor`);
- on Slurm and Kubernetes, nothing of tgnb's runs beside a job, so the run's node does
  (`tgnb.train.budget`): its own process (``python -m tgnb.train.launch``, or ``python -m
  tgnb.train`` alone) reads the run's `Budget` in its run file (`tgnb.runs.runfile`) and the
  run's events in its run directory on shared storage, which hold every earlier attempt's too;
  at the budget it stops the program as a preemption does (it checkpoints) and exits
  `tgnb.runs.node.Exit.STOPPED`, never restarted. It holds with the notebook closed.

One holder for each run, so an event is never recorded twice; `tgnb.runs.Run.wait` only prints
the notices.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tgnb.errors import ValidationError
from tgnb.events import BUDGET_NOTICE, BUDGET_REACHED, Event, read_jsonl
from tgnb.prices import NOTICE_FRACTION, Prices, check_budget, check_price, dollars
from tgnb.runs.cost import run_cost
from tgnb.runs.node import BUDGET_ENV, EVENTS, Exit
from tgnb.runs.spec import JobState, JobStatus, RunSpec

#: How a run stopped at its budget begins its status detail (it ends cancelled, exit 77).
BUDGET_STOP = "budget reached"
#: What happens at the budget, as the notices say it.
STOPPING = "SIGTERM; a program using protect or the Checkpointer checkpoints first"
WILL_STOP = f"the run will be stopped when it reaches the budget ({STOPPING})"


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
        """The run's status detail once stopped at its budget: it reads "cancelled: budget
        reached at $X of $Y" wherever it is shown (never a preemption)."""
        return f"{BUDGET_STOP} at {dollars(self.spent_usd)} of {dollars(self.budget_usd)}"

    @property
    def of(self) -> str:
        return f"{dollars(self.spent_usd)} of its {dollars(self.budget_usd)} budget"

    @property
    def data(self) -> dict[str, Any]:
        """The data of its events: ``spent_usd``, ``budget_usd``."""
        return {"spent_usd": round(self.spent_usd, 6), "budget_usd": self.budget_usd}


@dataclass(frozen=True)
class Budget:
    """What pricing a run against its budget takes: the dollars, the prices of its launch, and
    the GPUs it is priced for (the GPUs it asked for, on every node). The node reads it from its
    run file (`tgnb.runs.runfile.RunFile.budget`); a job rendered before the run file gives it as
    JSON (`to_json`, `from_json`) in `tgnb.runs.node.BUDGET_ENV`. No secret is in it."""

    budget_usd: float
    prices: Prices
    gpus: int

    @classmethod
    def of(cls, spec: RunSpec) -> Budget | None:
        """`spec`'s budget; None without a ``budget_usd`` or prices."""
        if spec.budget_usd is None or spec.prices is None:
            return None
        gpus = int(spec.resources.gpus_per_node) * int(spec.resources.nodes)
        return cls(float(spec.budget_usd), spec.prices, gpus)

    def to_json(self) -> str:
        prices = {"standard": self.prices.standard, "preemptible": self.prices.preemptible}
        return json.dumps({"budget_usd": self.budget_usd, "prices": prices, "gpus": self.gpus})

    @classmethod
    def from_json(cls, text: str) -> Budget:
        """The budget `to_json` wrote, checked as strictly as a launch checks it: a
        `ValidationError` naming what is wrong (the node refuses to start on it)."""
        try:
            data = json.loads(text)
            std, pre = data["prices"]["standard"], data["prices"]["preemptible"]
            usd, gpus = data["budget_usd"], data["gpus"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationError(
                f"{BUDGET_ENV} is not a run budget as tgnb writes it ({type(exc).__name__}: "
                f"{exc}): launch the run again through tgnb, which sets it"
            ) from None
        try:
            if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
                raise ValidationError(f"gpus must be a whole number >= 1, got {gpus!r:.40}")
            prices = Prices(check_price(std, "standard"), check_price(pre, "preemptible"))
            budget = check_budget(usd)
            if budget is None:
                raise ValidationError("budget_usd is null")
        except ValidationError as exc:
            raise ValidationError(f"{BUDGET_ENV}: {exc}") from None
        return cls(budget, prices, gpus)


def check(spec: RunSpec, events: Sequence[Event]) -> BudgetCheck | None:
    """The run's budget as its `events` say (None: no budget, or no prices): `check_events`."""
    found = Budget.of(spec)
    return None if found is None else check_events(spec.name, found, events)


def check_events(name: str, budget: Budget, events: Sequence[Event]) -> BudgetCheck:
    """Run `name`'s dollars so far at `budget`'s prices, from its lifecycle `events`
    (`tgnb.runs.cost`: real seconds between its starts and exits, the same measure on every
    engine and in the cockpit). The notice is due once; it comes first, however late it is seen.
    ``BudgetReached`` is due once its events lack it."""
    spent = run_cost(name, events, budget.gpus).dollars(budget.prices) or 0.0
    now = BudgetCheck(spent, budget.budget_usd, ())
    said = {e.reason for e in events}
    due: list[tuple[str, str]] = []
    if spent >= NOTICE_FRACTION * now.budget_usd and BUDGET_NOTICE not in said:
        pct = round(NOTICE_FRACTION * 100)
        due.append((BUDGET_NOTICE, f"{pct} % of the budget spent: {now.of}; {WILL_STOP}"))
    if now.reached and BUDGET_REACHED not in said:
        due.append((BUDGET_REACHED, f"{now.stop_reason}: stopping the run ({STOPPING})"))
    return replace(now, due=tuple(due))


def stopped_since(run_dir: str | os.PathLike[str], since: float) -> bool:
    """Whether the run was stopped at its budget after `since` (epoch seconds): a ``BudgetReached``
    in its events, recorded by whoever holds its budget before the SIGTERM. The runtime asks it
    at a SIGTERM, so that its exit reads as a budget stop, not a preemption."""
    evs = read_jsonl(Path(run_dir) / EVENTS)
    return any(e.reason == BUDGET_REACHED and e.time.timestamp() >= since for e in evs)


def settle(status: JobStatus, events: Sequence[Event]) -> JobStatus:
    """`status` of a job that exited `Exit.STOPPED` (77), told by the run's events: cancelled at
    its budget when the node recorded ``BudgetReached`` ("budget reached at $X of $Y"), else a
    failure of the program's own (a program may exit 77 for reasons of its own)."""
    if status.exit_code != int(Exit.STOPPED) or not status.state.finished:
        return status
    reached = [e for e in events if e.reason == BUDGET_REACHED]
    if reached:
        detail = reached[-1].message.partition(": stopping")[0]
        return replace(status, state=JobState.CANCELLED, detail=detail)
    detail = f"exit {int(Exit.STOPPED)} from the program itself (no budget stop was recorded)"
    return replace(status, state=JobState.FAILED, detail=detail)


__all__ = [
    "BUDGET_STOP",
    "Budget",
    "BudgetCheck",
    "check",
    "check_events",
    "settle",
    "stopped_since",
]
