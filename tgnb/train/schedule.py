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
(`tgnb.train.checkpoint.young_daly_steps`) on the measured step time and the *stall* and write
time of a save (``stall_s``/``write_s``, None before the first save: the stall is then taken
from `state_bytes`, copied at about 1 GB/s), weighing the policy's preemption estimate (notices,
when the program listens for them) and its failures (no notice), never longer apart than
`AUTO_MAX_SECONDS` of training. The interval ``auto`` chose is recorded once, with the rates
behind it (``CheckpointIntervalChosen``), when a `Recorder` is given. Nothing here imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tgnb.events import CHECKPOINT_INTERVAL
from tgnb.runs.policy import AUTO_MAX_SECONDS, CheckpointPolicy
from tgnb.train import checkpoint as ck
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
        self._began: float | None = None
        self._last_save = time.monotonic()
        self._reported = False

    def step_began(self) -> None:
        self._began = time.monotonic()

    def step_ended(self) -> None:
        """Time the step since `step_began` into `step_time_s` (an exponential average)."""
        if self._began is None:
            return
        took = time.monotonic() - self._began
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
        if p.every_steps and step % p.every_steps == 0:
            return True
        if p.every_seconds and time.monotonic() - self._last_save >= p.every_seconds:
            return True
        if p.auto_interval and self.step_time_s:
            return step - last_step >= self.auto_steps(stall_s, write_s, state_bytes)
        return False

    def auto_steps(
        self, stall_s: float | None, write_s: float | None, state_bytes: Callable[[], int]
    ) -> int:
        """The interval ``auto`` gives, in steps (needs `step_time_s`); recorded once."""
        p, step_time = self.policy, self.step_time_s
        assert step_time, "time a step (step_began, step_ended) first"
        stall = stall_s if stall_s is not None else state_bytes() / _ASSUMED_STAGE_BPS
        write = (write_s or stall) if p.async_save else 0.0  # a sync save is never in flight
        notices = p.preemption_rate if p.on_signal or p.watch_drain else 0.0
        failures = p.failures_per_hour + p.preemption_rate - notices  # unseen: failures
        every = ck.young_daly_steps(step_time, stall, failures, write, notices)
        every = min(every, max(1, int(AUTO_MAX_SECONDS / step_time)))  # the bound
        self._report(every)
        return every

    def _report(self, every: int) -> None:
        """Once: the interval ``auto`` chose, and the rates behind it."""
        if self._reported or self.recorder is None or not self.step_time_s:
            return
        self._reported = True
        p = self.policy
        seconds = every * self.step_time_s
        source = p.preemptions_source or f"{p.preemption_rate:g} preemptions per hour (the setting)"
        self.recorder.event(
            CHECKPOINT_INTERVAL,
            f"checkpoint every {every} steps ({seconds:.0f} s): {source}",
            every_steps=every,
            every_s=round(seconds, 3),
            preemptions_per_hour=p.preemption_rate,
            failures_per_hour=p.failures_per_hour,
            source="setting" if p.observed_preemptions_per_hour is None else "observed",
        )
