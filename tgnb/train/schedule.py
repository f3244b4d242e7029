"""The interval schedule: when the next periodic checkpoint is due.

::

    schedule = CheckpointSchedule(policy)
    for step in ...:
        schedule.step_began()
        ...                                                  # one optimizer step
        schedule.step_ended()
        if schedule.due(step, last_step, stall_s, write_s, state_bytes):
            save(...); schedule.saved()

Three rules, from `CheckpointPolicy`: ``every_steps`` (a step that is a multiple), ``every_seconds``
(since the last periodic save, or since the schedule was made) and ``auto``: Young/Daly
(`tgnb.train.checkpoint.young_daly_seconds`) on the measured step time and the *stall* and write
time of a save (``stall_s``/``write_s``, None before the first save: the stall is then taken
from `state_bytes`, copied at about 1 GB/s), weighing the policy's preemption estimate (notices,
when the program listens for them) and its failures (no notice), never longer apart than
`AUTO_MAX_SECONDS` of training. The step time is an exponential average that leaves out each
attempt's first step (it carries one-time costs: allocation, compilation). The interval in force
is `tgnb.train.interval.IntervalBoard`'s: announced at the first timed step and at each change
(``CheckpointIntervalChosen``, when a `Recorder` is given), and under ``auto`` never longer than
the one announced. Nothing here imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tgnb.runs.policy import AUTO_MAX_SECONDS, CheckpointPolicy
from tgnb.train import checkpoint as ck
from tgnb.train.interval import IntervalBoard, Reasons
from tgnb.train.record import Recorder

__all__ = ["CheckpointSchedule"]

_ASSUMED_STAGE_BPS = 1e9  # before the first save: a copy to CPU memory at about 1 GB/s


class CheckpointSchedule:
    """When periodic checkpoints are due under `policy` (see the module docstring)."""

    def __init__(self, policy: CheckpointPolicy, recorder: Recorder | None = None) -> None:
        self.policy = policy
        self.recorder = recorder
        #: the optimizer step's duration, smoothed (None until a step was timed)
        self.step_time_s: float | None = None
        #: the interval in force and its announcements
        self.board = IntervalBoard(policy, recorder)
        self._began: float | None = None
        self._ended = 0  # steps ended in this attempt
        self._last_save = time.monotonic()

    def step_began(self) -> None:
        self._began = time.monotonic()

    def step_ended(self) -> None:
        """Time the step since `step_began` into `step_time_s` (an exponential average; the
        attempt's first step is left out)."""
        if self._began is None:
            return
        took = time.monotonic() - self._began
        self._ended += 1
        if self._ended == 1:
            return
        self.step_time_s = took if self.step_time_s is None else 0.8 * self.step_time_s + 0.2 * took

    def saved(self) -> None:
        """A periodic save was made now (``every_seconds`` counts from here)."""
        self._last_save = time.monotonic()

    def due(
        self,
        step: int,
        last_step: int,
        stall_s: float | None,
        write_s: float | None,
        state_bytes: Callable[[], int],
    ) -> bool:
        """Whether a periodic save is due at the end of `step`, the last save having been at
        `last_step`; `state_bytes` is called only while `stall_s` is not known."""
        p = self.policy
        if p.auto_interval and self.step_time_s:
            return step - last_step >= self.auto_steps(stall_s, write_s, state_bytes, step)
        if self.step_time_s and (p.every_steps or p.every_seconds):
            self._fixed(step)
        if p.every_steps and step % p.every_steps == 0:
            return True
        return bool(p.every_seconds and time.monotonic() - self._last_save >= p.every_seconds)

    def _fixed(self, step: int) -> None:
        """Announce the run's own interval (``every_steps`` / ``every_seconds``) in steps and
        seconds at the step time now (again when it moves: `tgnb.train.interval`)."""
        p, step_time = self.policy, self.step_time_s
        assert step_time
        ideal = min(p.every_steps or float("inf"), (p.every_seconds or float("inf")) / step_time)
        rule = "every_steps" if ideal == p.every_steps else "every_seconds"
        self.board.settle(ideal, step_time, Reasons(rule), step)

    def auto_steps(
        self,
        stall_s: float | None,
        write_s: float | None,
        state_bytes: Callable[[], int],
        step: int | None = None,
    ) -> int:
        """The interval ``auto`` has in force, in steps (needs `step_time_s`): Young/Daly's,
        announced when it moves (`tgnb.train.interval.IntervalBoard`)."""
        p, step_time = self.policy, self.step_time_s
        assert step_time, "time a step (step_began, step_ended) first"
        stall = stall_s if stall_s is not None else state_bytes() / _ASSUMED_STAGE_BPS
        write = (write_s or stall) if p.async_save else 0.0  # a sync save is never in flight
        notices = p.preemption_rate if p.on_signal or p.watch_drain else 0.0
        failures = p.failures_per_hour + p.preemption_rate - notices  # unseen: failures
        tau = ck.young_daly_seconds(stall, failures, write, notices)
        cap = max(1.0, float(int(AUTO_MAX_SECONDS / step_time)))  # the bound
        why = Reasons(
            "auto",
            stall_s=stall,
            measured=stall_s is not None,
            write_s=write,
            no_notice_per_hour=failures,
            notices_per_hour=notices,
            capped=tau / step_time > cap,
        )
        return self.board.settle(max(1.0, tau / step_time), step_time, why, step, cap)
