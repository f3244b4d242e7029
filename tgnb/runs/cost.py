"""GPU-hours of a run on standard and preemptible nodes, the work lost to preemptions, and their
dollars: computed from the run's lifecycle events.

A run holds its GPUs from ``RunStarted``/``RunResumed`` until ``RunRequeued``/``RunExited`` (or
now), on the node the event names. Work lost to a preemption is the time trained after the last
checkpoint of a stretch that ended in a requeue: it is redone after the resume. The notebook's
``%tg cost`` (`tgnb.notebook.cost`), `tgnb.runs.Run.summary` and a run's budget (the local
supervisor) all count here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from tgnb import events as ev
from tgnb.events import Event, utcnow
from tgnb.prices import Prices, node_class
from tgnb.runs.spec import EXIT_PREEMPTED


@dataclass
class RunCost:
    """One run's GPU-hours by node class, and what preemptions cost it."""

    run: str
    gpus: int
    standard_gpu_hours: float = 0.0
    preemptible_gpu_hours: float = 0.0
    preemptions: int = 0
    lost_gpu_hours: float = 0.0
    lost_steps: int = 0

    def dollars(self, prices: Prices | None) -> float | None:
        """What these GPU-hours cost at `prices` (None without prices)."""
        if prices is None:
            return None
        return prices.cost(self.standard_gpu_hours, self.preemptible_gpu_hours)


def _preempted_exit(e: Event) -> bool:
    data = e.data or {}
    return data.get("exit_reason") == "preempted" or data.get("exit_code") == EXIT_PREEMPTED


def run_cost(name: str, events: Iterable[Event], gpus: int, now: datetime | None = None) -> RunCost:
    """GPU-hours and lost work of one run from its lifecycle events.

    A stretch ends in a preemption when the process exits as preempted (exit code 75) or the run is
    requeued (a ``RunRequeued`` after a stretch counts once, with or without a ``RunExited``). A
    requeue with ``moved`` (the supervisor stopped the run to go back to preemptible nodes: exit 75
    too) is no preemption.
    """
    out = RunCost(name, gpus)
    end_now = (now or utcnow()).timestamp()
    seg: tuple[float, str | None] | None = None
    last_ckpt: tuple[float, int | None] | None = None
    last_step: int | None = None
    counted = True  # whether the last closed stretch was already counted as a preemption
    last_closed: tuple[float, float] | None = None
    #: the loss of a stretch that exited as preempted, counted unless a ``moved`` requeue follows
    pending: tuple[float, int] | None = None

    def loss(start: float, end: float) -> tuple[float, int]:
        saved_at = last_ckpt[0] if last_ckpt and last_ckpt[0] >= start else start
        steps = 0
        if last_step is not None and last_ckpt and last_ckpt[1] is not None:
            steps = max(last_step - last_ckpt[1], 0)
        return max(end - saved_at, 0.0) * gpus / 3600, steps

    def count(lost: tuple[float, int] | None) -> None:
        if lost is not None:
            out.preemptions += 1
            out.lost_gpu_hours += lost[0]
            out.lost_steps += lost[1]

    def close(t: float, preempted: bool) -> None:
        nonlocal seg, counted, last_closed, pending
        if seg is None:
            return
        start, node = seg
        hours = max(t - start, 0.0) * gpus / 3600
        if node_class(node or "") == "preemptible":
            out.preemptible_gpu_hours += hours
        else:
            out.standard_gpu_hours += hours
        if preempted:
            pending = loss(start, t)
        counted, last_closed, seg = preempted, (start, t), None

    for e in sorted(events, key=lambda e: e.time):
        if e.source == "cluster":
            continue
        t = e.time.timestamp()
        step = e.data.get("step") if e.data else None
        if isinstance(step, int):
            last_step = step
        if e.reason == ev.RUN_STARTED or (e.reason == ev.RUN_RESUMED and seg is None):
            close(t, False)
            count(pending)
            pending, seg = None, (t, e.node)
        elif e.reason == ev.CHECKPOINT_SAVED:
            last_ckpt = (t, step if isinstance(step, int) else None)
        elif e.reason == ev.RUN_EXITED:
            close(t, _preempted_exit(e))
        elif e.reason == ev.RUN_REQUEUED:
            moved = bool((e.data or {}).get("moved"))
            close(t, not moved)
            if not moved and pending is None and not counted and last_closed is not None:
                pending = loss(*last_closed)
            count(None if moved else pending)
            pending, counted = None, True
    close(end_now, False)
    count(pending)
    return out


__all__ = ["RunCost", "run_cost"]
