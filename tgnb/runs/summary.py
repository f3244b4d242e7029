"""What a run achieved and what it cost, as `tgnb.runs.Run.summary` gives it and `Run.wait`'s last
line says it: the steps from the program's own records (None where it reports none), the
preemptions, GPU-hours and dollars from the engine's meter (`tgnb.runs.cost`, `tgnb.runs.meter`).
Pure functions of what was read (plain lists of rows and events): no I/O here. `Run` (and so the
server's run JSON and a sweep's table), `tgnb certify`'s steps lost per event (`attempts`) and
the spending (`spending`) are all computed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tgnb.events import (
    DRAIN_NOTICE,
    JOB_RELEASED,
    RUN_EXITED,
    RUN_REQUEUED,
    RUN_RESUMED,
    RUN_STARTED,
    SIGNAL_RECEIVED,
    Event,
)
from tgnb.prices import Prices, dollars
from tgnb.runs.cost import RunCost
from tgnb.runs.meter import metered
from tgnb.runs.outcome import UNPROTECTED, UNSAVED
from tgnb.runs.replicas import UNPROTECTED_GROUPS, group_clause, group_lines


def summarize(
    name: str,
    state: str,
    rows: list[dict[str, Any]],
    evs: list[Event],
    cost: RunCost,
    *,
    max_steps: int | None,
    restarts: int,
    kind: str,
    spending: dict[str, Any],
) -> dict[str, Any]:
    """What the run achieved: steps done against max_steps (None: the program reports no
    steps), steps lost to restarts (steps done but not in the checkpoint a restart resumed from:
    all of them when it started again from step 0, its node gone with no notice; None when
    unknown), restarts, preemptions (the engine's notices, `cost`; the program's for a run
    recorded before the engine metered it), first and last reward; the node-time preemptions
    made it redo (``lost_gpu_hours``, ``lost_node_seconds``); its GPU-hours and their dollars
    (`spending`: ``gpu_hours``, ``cost_usd``, None when no price is known) against its
    ``budget_usd``; a fault-tolerant run's ``groups`` (`tgnb.runs.replicas.group_lines`: who
    left, joined, healed from whom, at which step, in how long; None for other runs). A program
    that never called protect or the Checkpointer (no ``RunStarted``) is named in `note`
    (`tgnb.runs.outcome.UNPROTECTED`): each restart lost every step it had logged; a stop with
    no checkpoint says so there too."""
    steps = [int(r["step"]) for r in rows if "step" in r]
    notices = {(ev.reason, ev.data.get("step")) for ev in evs if ev.reason in _PREEMPTIONS}
    notices -= _moves(evs)
    # the engine's notices when it metered the run; the program's, for a run recorded before
    preemptions = cost.preemptions if metered(evs) else len({step for _, step in notices})
    lost = 0
    starts = [i for i, ev in enumerate(evs) if ev.reason == RUN_STARTED and ev.source == "run"]
    # no hook of tgnb's seen: unknown while nothing ran yet, unprotected once the engine
    # released a node it ran on (or it restarted, or it logged rows) with no start of its own
    released = any(e.reason == JOB_RELEASED for e in evs)
    protected = bool(starts) or not (rows or restarts or released)
    if not starts:  # unprotected: each restart began again at step 0
        lost = _lost_unprotected(evs, rows)
    for attempt in attempts(rows, evs)[1:]:  # each restart: what it did not resume is lost
        if attempt.resumed is None and not attempt.trained:
            continue  # it trained nothing (found the run finished, or was stopped at once)
        lost += attempt.lost
    groups = group_lines(evs)
    if groups:  # replica groups: each group's start is no restart; a healed one lost nothing
        lost = cost.lost_steps or 0
    key = next((k for k in ("reward", "rewards/margins") if any(k in r for r in rows)), None)
    # rounded to 4 significant digits: a summary is read, not computed with
    rewards = [float(f"{float(r[key]):.4g}") for r in rows if key and r.get(key) is not None]
    return {
        "run": name,
        "state": state,
        "steps": max(steps, default=None),  # None: unknown, the program reports no steps
        "max_steps": max_steps,
        "steps_lost": lost if steps or starts else None,
        "restarts": restarts,
        "preemptions": preemptions,
        "kind": kind,
        "protected": protected,
        "note": UNPROTECTED_GROUPS if groups and not protected else _note(evs, protected),
        "reward_key": key,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "lost_gpu_hours": round(cost.lost_gpu_hours, 4),
        "lost_node_seconds": round(cost.lost_node_seconds, 1),
        # a fault-tolerant run's groups: who left, joined, healed (`tgnb.runs.replicas`)
        "groups": groups or None,
        **spending,
    }


_PREEMPTIONS = (SIGNAL_RECEIVED, DRAIN_NOTICE)


@dataclass(frozen=True)
class Attempt:
    """One start of the program (its ``RunStarted``): when (`at`, epoch seconds), the last step
    logged before it, the step it resumed from (None: no ``RunResumed``, it began at step 0) and
    whether any step was logged from then on."""

    at: float
    before: int
    resumed: int | None
    trained: bool

    @property
    def lost(self) -> int:
        """Steps done before this start that it did not resume: done again."""
        return max(0, self.before - (self.resumed or 0))


def attempts(rows: list[dict[str, Any]], evs: list[Event]) -> list[Attempt]:
    """Every start of the program, in order, from its metric `rows` and events `evs` (oldest
    first): `summarize` counts the restarts' `Attempt.lost`, `tgnb certify` the one after each
    event it fired."""
    steps = [(float(r.get("time", 0)), int(r["step"])) for r in rows if "step" in r]
    starts = [i for i, ev in enumerate(evs) if ev.reason == RUN_STARTED and ev.source == "run"]
    out = []
    for n, i in enumerate(starts):
        until = starts[n + 1] if n + 1 < len(starts) else len(evs)
        resume = next(
            (e for e in evs[i:until] if e.reason == RUN_RESUMED and "step" in e.data), None
        )
        at = evs[i].time.timestamp()
        out.append(
            Attempt(
                at,
                max((step for t, step in steps if t < at), default=0),
                None if resume is None else int(resume.data["step"]),
                any(t >= at for t, _ in steps),
            )
        )
    return out


def last_step(rows: list[dict[str, Any]], evs: list[Event], script: bool) -> int | None:
    """The run's last optimizer step from its metric `rows`; with none, 0 when it has started
    a step loop tgnb knows (a ``RunStarted`` of the program's, or not a `script`), else None:
    the program reports no steps (a script that never imports tgnb, a command), never 0."""
    steps = [int(r["step"]) for r in rows if isinstance(r.get("step"), int)]
    if steps:
        return max(steps)
    hooked = any(e.reason == RUN_STARTED and e.source == "run" for e in evs)
    return 0 if hooked or not script else None


def spending(cost: RunCost, prices: Prices | None, budget_usd: float | None) -> dict[str, Any]:
    """``gpu_hours`` so far, their ``cost_usd`` at `prices` (None when no price is known) and
    the run's ``budget_usd`` (None: no budget)."""
    usd = cost.dollars(prices)
    return {
        "gpu_hours": round(cost.standard_gpu_hours + cost.preemptible_gpu_hours, 4),
        "cost_usd": None if usd is None else round(usd, 4),
        "budget_usd": budget_usd,
    }


def _lost_unprotected(evs: list[Event], rows: list[dict[str, Any]]) -> int:
    """Steps lost by a program with no hook: at each requeue, every step it had logged since the
    attempt before began (it starts again from step 0)."""
    lost, begun = 0, 0.0
    for ev in evs:
        if ev.reason != RUN_REQUEUED or ev.source != "tgnb":
            continue
        at = ev.time.timestamp()
        logged = [int(r["step"]) for r in rows if begun <= float(r.get("time", 0)) < at]
        lost += max(logged, default=0)
        begun = at
    return lost


def _note(evs: list[Event], protected: bool) -> str | None:
    """What the cockpit says of how the run stopped: unprotected, or the last stop without a
    checkpoint (`tgnb.runs.outcome.unsaved_line`)."""
    if not protected:
        return UNPROTECTED
    unsaved = [
        ev
        for ev in evs
        if (ev.reason == RUN_REQUEUED and ev.data.get("unsaved"))
        or (ev.reason == RUN_EXITED and ev.data.get("exit_reason") == UNSAVED)  # a node's launcher
    ]
    return unsaved[-1].message.partition(" (exit")[0] if unsaved else None


def _moves(evs: list[Event]) -> set[tuple[str, Any]]:
    """The notices of stops on purpose: the SIGTERM before a ``RunRequeued`` with ``moved`` (the
    supervisor took the run back to preemptible nodes), no preemption."""
    out: set[tuple[str, Any]] = set()
    last: tuple[str, Any] | None = None
    for ev in evs:
        if ev.reason in _PREEMPTIONS:
            last = (ev.reason, ev.data.get("step"))
        elif ev.reason == RUN_REQUEUED and ev.data.get("moved") and last is not None:
            out.add(last)
            last = None
        elif ev.reason == RUN_REQUEUED:
            last = None
    return out


def closing_line(name: str, state: str, detail: str, summary: dict[str, Any]) -> str:
    """One line on how the run ended and what it cost (``run r: cancelled (budget reached at
    $0.02 of $0.02); 0.0056 GPU-h, $0.0213, 0 preemptions``)."""
    why = f" ({detail})" if detail else ""
    usd = "" if summary["cost_usd"] is None else f", {dollars(summary['cost_usd'])}"
    n = summary["preemptions"]
    return (
        f"run {name}: {state}{why}; {summary['gpu_hours']:g} GPU-h{usd}, "
        f"{n} preemption{'' if n == 1 else 's'}{group_clause(summary.get('groups') or [])}"
    )


__all__ = ["Attempt", "attempts", "closing_line", "last_step", "spending", "summarize"]
