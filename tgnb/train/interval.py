"""The periodic checkpoint interval in force, and its announcements (``CheckpointIntervalChosen``).

The interval told is the interval used. `IntervalBoard.settle` takes what the policy's rule gives
now (``auto``: Young/Daly's optimum, `tgnb.train.checkpoint.young_daly_seconds`, in steps of the
measured step time; or the run's own ``every_steps`` / ``every_seconds``) and returns the interval
in force, in steps. The first one of an attempt is announced, and after it each change, as one
``CheckpointIntervalChosen`` event: the interval in steps and in seconds, the one it replaces, and
why, in words (the stall a save causes, measured or guessed; the interruptions expected an hour,
with and without notice, and where the preemption rate came from).

Under ``auto`` the interval in force is always the one last announced: a new one is announced
(and from then on used) when the optimum differs from it by more than `THRESHOLD` (a quarter,
and at least one step), when its steps now take more than `THRESHOLD` longer than announced (the
steps slowed), or when it would pass `tgnb.runs.policy.AUTO_MAX_SECONDS`. So a node lost with no
notice loses at most the steps last announced (plus those trained while a save is being
written). Staying within a quarter of the optimum costs little: the time lost to saves and
to lost work grows by at most 2.5 % of itself ((1.25 + 1/1.25) / 2). With ``every_steps`` the
steps are the setting's, announced once; with ``every_seconds`` the seconds are, and its steps
(at the step time then) are announced again when they move by more than `THRESHOLD`. On several
ranks each rank keeps its own interval (its own step time and saves), a save comes when any
rank's is due, and rank 0 announces its own: the interval used is never longer than the one
announced. This module is light (no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgnb.events import CHECKPOINT_INTERVAL
from tgnb.runs.policy import AUTO_MAX_SECONDS, CheckpointPolicy
from tgnb.train.record import Recorder

__all__ = ["THRESHOLD", "Interval", "IntervalBoard", "Reasons"]

#: How far the interval a rule gives may drift from the one announced before it is announced
#: again (a share of it; at least one step).
THRESHOLD = 0.25


@dataclass(frozen=True)
class Interval:
    """An interval announced: `steps` optimizer steps, `seconds` of training at `step_s` a step."""

    steps: int
    seconds: float
    step_s: float


@dataclass(frozen=True)
class Reasons:
    """Why the rule gives what it gives (what the announcement says). `rule`: ``auto``,
    ``every_steps`` or ``every_seconds``; the rest only for ``auto``."""

    rule: str
    stall_s: float = 0.0
    measured: bool = False  # the stall was measured (else guessed from the state's size)
    write_s: float = 0.0  # a save's start to its marker (0: synchronous saves)
    no_notice_per_hour: float = 0.0
    notices_per_hour: float = 0.0
    capped: bool = False  # the optimum was past AUTO_MAX_SECONDS


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _rate(per_hour: float) -> str:
    return f"{per_hour:.2g}" if per_hour < 1000 else f"{per_hour:,.0f}"


def _s(n: float) -> str:
    return "" if _rate(n) == "1" else "s"


def _preemptions_from(policy: CheckpointPolicy) -> str:
    """Where the preemption rate weighed came from, in words."""
    if policy.observed_preemptions_per_hour is None:
        return "your setting checkpoint.preemptions_per_hour"
    source = policy.preemptions_source or ""
    own = " and this run's own" if "this run's own" in source else ""
    return f"estimated from the preemptions seen on the cluster{own}"


def describe(new: Interval, was: Interval | None, why: Reasons, policy: CheckpointPolicy) -> str:
    """The announcement of `new` (replacing `was`), in plain words."""
    head = f"checkpoint every {new.steps} step{'s' if new.steps != 1 else ''}"
    if why.rule == "every_seconds":
        head = f"checkpoint every {_duration(new.seconds)} (about {new.steps} steps)"
    else:
        head += f" ({_duration(new.seconds)})"
    if was is not None:
        head += f", was {was.steps} ({_duration(was.seconds)})"
    these = _duration(new.seconds) if why.rule == "every_seconds" else f"{new.steps} steps"
    loss = f"a node lost with no notice loses at most these {these}"
    if why.rule != "auto":
        return f"{head}: checkpoint.{why.rule}, set for this run; {loss}"
    if why.measured:
        stall = f"a save pauses training {_duration(why.stall_s)} (measured)"
    else:
        stall = (
            f"a save should pause training about {_duration(why.stall_s)} (guessed from the "
            "model's size until a save is measured)"
        )
    lost = why.no_notice_per_hour
    expects = f"expected an hour: {_rate(lost)} interruption{_s(lost)} with no notice"
    if why.notices_per_hour:
        expects += (
            f", {_rate(why.notices_per_hour)} preemption{_s(why.notices_per_hour)} with one"
            f" ({_preemptions_from(policy)})"
        )
    elif policy.preemption_rate:
        expects += " (preemptions among them: the run listens for no notice)"
    if why.write_s and why.measured:
        loss += f" (and those trained while a save is written, {_duration(why.write_s)})"
    cap = (
        f"; capped at {_duration(AUTO_MAX_SECONDS)} of training (checkpoint.auto's bound)"
        if why.capped
        else ""
    )
    return f"{head}: {stall}; {expects}{cap}; {loss}"


class IntervalBoard:
    """The interval in force, announced to `recorder` (see the module docstring)."""

    def __init__(self, policy: CheckpointPolicy, recorder: Recorder | None = None) -> None:
        self.policy = policy
        self.recorder = recorder
        #: the interval last announced (None: none yet in this attempt)
        self.current: Interval | None = None

    def _moved(self, ideal: float, step_s: float, cap: float, rule: str) -> bool:
        cur = self.current
        if cur is None:
            return True
        if abs(ideal - cur.steps) > max(THRESHOLD * cur.steps, 1.0) or cur.steps > cap:
            return True
        slower = cur.steps * step_s > cur.seconds * (1.0 + THRESHOLD)
        return slower and rule == "auto"  # every_steps: the steps are the setting's

    def settle(
        self,
        ideal: float,
        step_s: float,
        why: Reasons,
        step: int | None = None,
        cap: float = math.inf,
    ) -> int:
        """The interval in force, in steps, given the rule's `ideal` (steps, unrounded) at
        `step_s` a step, never more than `cap` steps; announced (at `step`) when it changes."""
        ideal = min(ideal, cap)
        if self._moved(ideal, step_s, cap, why.rule):
            steps = max(1, round(ideal))
            if cap < math.inf:
                steps = max(1, min(steps, math.floor(cap)))
            self._announce(Interval(steps, steps * step_s, step_s), why, step)
        assert self.current is not None
        return self.current.steps

    def _announce(self, new: Interval, why: Reasons, step: int | None) -> None:
        was, self.current = self.current, new
        if self.recorder is None:
            return
        p = self.policy
        data = {
            "every_steps": new.steps,
            "every_s": round(new.seconds, 3),
            "step_s": round(new.step_s, 4),
            "rule": why.rule,
            "was_steps": was.steps if was else None,
            "was_s": round(was.seconds, 3) if was else None,
            "step": step,
        }
        if why.rule == "auto":
            data |= {
                "stall_s": round(why.stall_s, 4),
                "stall_measured": why.measured,
                "write_s": round(why.write_s, 4),
                "no_notice_per_hour": why.no_notice_per_hour,
                "notices_per_hour": why.notices_per_hour,
                "capped": why.capped,
                "preemptions_per_hour": p.preemption_rate,
                "failures_per_hour": p.failures_per_hour,
                "source": "setting" if p.observed_preemptions_per_hour is None else "observed",
                "detail": p.preemptions_source
                or f"{p.preemption_rate:g} preemptions per hour (the setting)",
            }
        self.recorder.event(CHECKPOINT_INTERVAL, describe(new, was, why, p), **data)
