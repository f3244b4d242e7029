"""GPU-hours of a run on standard and preemptible nodes, the work lost to preemptions, and their
dollars: computed from what the engine ran.

A run holds a node's GPUs from the engine's ``JobPlaced`` to its ``JobReleased`` (`tgnb.runs.meter`),
whatever its program is: protected or not, a script, a command. Preemptions are the attempts the
engine saw preempted (`tgnb.runs.meter.preempted_attempts`). Work lost to a preemption is the
node-time after the last checkpoint of a preempted stretch (all of it when none was saved in it):
it is redone after the resume. Steps lost come from the program's own records, and are None
(unknown) when it reports no steps. The notebook's ``%tg cost`` (`tgnb.notebook.cost`),
`tgnb.runs.Run.summary`, the RunPanel, the sidebar and a run's budget (the local supervisor, the
node on Slurm and Kubernetes) all count here.

A fault-tolerant run's replica groups (issue 50) are metered group by group: each group's node
from its placement to its release, a replacement's from its own placement. A preempted group is
one preemption; it made the run redo nothing while another group held its node (the others train
on at their step, and the replacement heals from them), else (every group gone) what it did after
its last checkpoint, as an attempt's.

Runs recorded before the engine metered them (no ``JobPlaced``) are counted, as then, from the
program's own ``RunStarted``/``RunResumed`` to ``RunRequeued``/``RunExited`` (`_from_program`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from tgnb import events as ev
from tgnb.events import Event, utcnow
from tgnb.prices import Prices, node_class
from tgnb.runs import meter
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
    #: node-seconds a preemption made the run redo (the engine's meter; 0 for older records)
    lost_node_seconds: float = 0.0
    #: None: unknown, the program reports no steps
    lost_steps: int | None = 0

    def dollars(self, prices: Prices | None) -> float | None:
        """What these GPU-hours cost at `prices` (None without prices)."""
        if prices is None:
            return None
        return prices.cost(self.standard_gpu_hours, self.preemptible_gpu_hours)


def _preempted_exit(e: Event) -> bool:
    data = e.data or {}
    return data.get("exit_reason") == "preempted" or data.get("exit_code") == EXIT_PREEMPTED


def run_cost(name: str, events: Iterable[Event], gpus: int, now: datetime | None = None) -> RunCost:
    """GPU-hours and lost work of one run: from the engine's meter when it has one
    (`_from_engine`), else from the program's records (`_from_program`). `gpus` is what the run
    asked for (the engine's events give what each node held)."""
    evs = sorted(events, key=lambda e: e.time)
    if meter.metered(evs):
        return _from_engine(name, evs, gpus, now)
    return _from_program(name, evs, gpus, now)


def _from_engine(name: str, evs: list[Event], gpus: int, now: datetime | None) -> RunCost:
    """The engine's stretches priced by node class; a preempted attempt's loss is each of its
    stretches' node-time after the last checkpoint saved in it, and its steps after that
    checkpoint's step (None when the program reports no steps)."""
    out = RunCost(name, gpus)
    runs = meter.stretches(evs, None if now is None else now.timestamp())
    for s in runs:
        if s.node_class == "preemptible":
            out.preemptible_gpu_hours += s.gpu_hours
        else:
            out.standard_gpu_hours += s.gpu_hours
    ckpts = [(e.time.timestamp(), _step(e)) for e in evs if e.reason == ev.CHECKPOINT_SAVED]
    steps = [(e.time.timestamp(), st) for e in evs if (st := _step(e)) is not None]
    # the program reports steps: some of its records carry one, or it runs under a hook of tgnb's
    reported = bool(steps) or any(e.reason == ev.RUN_STARTED and e.source == "run" for e in evs)
    for att in meter.preempted_attempts(runs):
        mine = [s for s in runs if s.attempt == att]
        out.preemptions += 1
        _charge(out, mine, ckpts, steps, _resumed(evs, min(s.start for s in mine)))
    for s in meter.preempted_groups(runs):
        out.preemptions += 1
        if not _survived(s, runs):  # else the others trained on and its replacement heals from them
            _charge(out, [s], ckpts, steps, 0)
    if not reported:  # the program reports no steps: what it lost in steps is unknown
        out.lost_steps = None
    return out


def _charge(
    out: RunCost,
    mine: list[meter.Stretch],
    ckpts: list[tuple[float, int | None]],
    steps: list[tuple[float, int]],
    unsaved: int,
) -> None:
    """Add to `out` what the preempted stretches `mine` (an attempt's, or one group's) made the run
    redo: each one's node-time after the last checkpoint saved between their start and end, and
    the steps after that checkpoint's (`unsaved` when none was saved)."""
    start, end = min(s.start for s in mine), max(s.end for s in mine)
    saved = [c for c in ckpts if start <= c[0] <= end]
    saved_at = saved[-1][0] if saved else start
    redo = [max(s.end - max(saved_at, s.start), 0.0) for s in mine]
    out.lost_node_seconds += sum(redo)
    out.lost_gpu_hours += sum(r * s.gpus for r, s in zip(redo, mine, strict=True)) / 3600
    if out.lost_steps is None:
        return
    last = max((st for t, st in steps if start <= t <= end), default=None)
    base = saved[-1][1] if saved and saved[-1][1] is not None else unsaved
    if last is not None:
        out.lost_steps += max(last - base, 0)


def _survived(lost: meter.Stretch, runs: list[meter.Stretch]) -> bool:
    """Whether another replica group held its node when group `lost` was given back, and kept it
    (it was not preempted too) or held it still when `lost`'s replacement was placed (to heal
    from): then the run went on in its quorum, at its step."""
    gone = meter.preempted_groups(runs)
    again = [s.start for s in runs if s.group == lost.group and s.start >= lost.end]
    return any(
        o.group is not None
        and o.group != lost.group
        and o.start <= lost.end <= o.end
        and (o not in gone or (bool(again) and again[0] <= o.end))
        for o in runs
    )


def _step(e: Event) -> int | None:
    step = (e.data or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _resumed(evs: list[Event], since: float) -> int:
    """The step the attempt begun at `since` resumed from (0: from the start)."""
    for e in evs:
        if e.time.timestamp() >= since and e.reason == ev.RUN_RESUMED and _step(e) is not None:
            return int(_step(e) or 0)
    return 0


def _from_program(
    name: str, events: Iterable[Event], gpus: int, now: datetime | None = None
) -> RunCost:
    """GPU-hours and lost work of one run from its program's lifecycle events.

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
            out.lost_steps = (out.lost_steps or 0) + lost[1]

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
