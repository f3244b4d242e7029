"""The chaos schedule: what certify does to the interrupted run, one event per attempt, each
driven for real on the local engine (a preemption through the emulator, a SIGKILL to the training
process), and the attempt's end observed before the next event.

Each event waits for its moment (placed; a save in flight; a step), fires, and records when. A
preemption is the emulator's (the node gets its notice and is drained) and, at the same moment, the
SIGTERM the engine sends the program on a notice, sent by certify itself: the engine polls the node
every second or so, and a signal that late would miss the moment chosen (a save in flight lasts
milliseconds). An
event whose moment never comes (the run finished first, the budget ran out, no save was ever seen
in flight) is reported NOT DONE with why: certify never claims an event it did not cause.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tgnb.runs.node import CHECKPOINTS
from tgnb.runs.run import Run
from tgnb.train import checkpoint as ck

POLL = 0.01  # seconds between looks while waiting for a moment (a tiny save lasts ~50 ms)


@dataclass
class Fired:
    """One event of the schedule: what it is, and what happened (`fired_at` None: NOT DONE)."""

    kind: str  # "setup", "first-save", "random-step", "kill", "shrink"
    label: str
    fired_at: float | None = None
    at_step: int | None = None  # the newest step logged when it fired
    note: str = ""
    restart: int | None = None  # the run's restart count when it fired

    @property
    def done(self) -> bool:
        return self.fired_at is not None


@dataclass
class Driver:
    """Drives the events on `run` (the interrupted run) of `session`; `reference` is the
    uninterrupted run; `until`: the monotonic deadline of the budget."""

    session: Any
    run: Run
    reference: Run
    until: float
    rng: random.Random
    events: list[Fired] = field(default_factory=list)

    # -- what the run shows -------------------------------------------------------------------
    def _steps_since(self, t0: float) -> list[int]:
        return [
            int(r["step"]) for r in self.run.records("metrics") if float(r.get("time", 0)) >= t0
        ]

    def _last_step(self) -> int | None:
        steps = [int(r["step"]) for r in self.run.records("metrics") if "step" in r]
        return max(steps) if steps else None

    def _no_hook(self) -> bool:
        """The uninterrupted run finished without ever recording a step: the program has no hook
        (certify then fires step events at once instead of at a step)."""
        return self.reference.state.finished and not self.reference.records("metrics")

    def _wait(self, moment: Callable[[], bool], poll: float = 0.1) -> str:
        """Wait for `moment`; "" once it came, else why not."""
        while True:
            if time.monotonic() > self.until:
                return "the time budget ran out first (raise --budget-s)"
            st = self.run.status
            if st.state.finished:
                return f"the run had {st.state.value} first"
            if st.state.value == "running" and st.nodes and moment():
                return ""
            time.sleep(poll)

    def _attempt_over(self, restart: int) -> None:
        """Wait until the attempt hit by an event has ended (a restart, or the run finished)."""
        while time.monotonic() < self.until:
            st = self.run.status
            if st.state.finished or st.restart_count > restart:
                return
            time.sleep(0.1)

    def _fire(self, ev: Fired, act: Callable[[], None]) -> None:
        ev.restart = self.run.status.restart_count
        ev.at_step = self._last_step()
        ev.fired_at = time.time()
        act()
        self._attempt_over(ev.restart)

    def _preempt(self) -> None:
        """The notice to the program now (SIGTERM, as the engine sends), the node preempted."""
        node = self.run.status.nodes[0]
        self._signal(signal.SIGTERM)
        self.session.preempt(node)

    def _kill(self) -> None:
        """SIGKILL the training processes of the attempt: no notice, no save."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        jobs = self.run.refresh().jobs
        for pid in (jobs[-1].info.get("children") or []) if jobs else []:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), sig)

    # -- the events ---------------------------------------------------------------------------
    def setup(self) -> Fired:
        ev = Fired("setup", "preemption during setup, before the first step")
        started = self.run.status.restart_count
        why = self._wait(lambda: self.run.status.restart_count == started)
        if why:
            ev.note = why
        else:
            self._fire(ev, self._preempt)
        return ev

    def first_save(self) -> Fired:
        """Preempt while a save is in flight (its directory there, its marker not yet)."""
        ev = Fired("first-save", "preemption during the first save")
        ckpts = self.run.run_dir / CHECKPOINTS if self.run.run_dir else None
        seen: set[str] = set()
        caught: list[str] = []

        def in_flight() -> bool:
            if ckpts is None or not ckpts.is_dir():
                return self._no_hook()
            for d in ck.checkpoint_dirs(ckpts):
                if d.name in seen:
                    continue
                seen.add(d.name)
                if not (d / ck.MARKER).exists():
                    caught.append(d.name)
                    return True
            return False

        why = self._wait(in_flight, POLL)
        if why:
            ev.note = why if seen else f"{why}; no save was seen"
            return ev
        if caught:
            first = len(seen) == 1
            ev.note = f"{caught[0]} being written" + ("" if first else f" (save {len(seen)})")
            if not first:
                ev.label = f"preemption during a save (the run's save {len(seen)}: the earlier "
                ev.label += "were not caught in flight)"
        else:
            ev.note = "the program writes no checkpoint: fired at once"
        self._fire(ev, self._preempt)
        return ev

    def _at_new_steps(self, ev: Fired, act: Callable[[], None]) -> Fired:
        k = self.rng.randint(2, 6)
        t0 = time.time()
        why = self._wait(lambda: len(self._steps_since(t0)) >= k or self._no_hook())
        if why:
            ev.note = why
        else:
            ev.note = f"{k} steps into the attempt" if not self._no_hook() else "no steps logged"
            self._fire(ev, act)
        return ev

    def random_step(self) -> Fired:
        return self._at_new_steps(Fired("random-step", "preemption with notice at a random step"),
                                  self._preempt)  # fmt: skip

    def kill(self) -> Fired:
        return self._at_new_steps(Fired("kill", "kill with no notice (SIGKILL)"), self._kill)

    def schedule(self) -> list[Fired]:
        for event in (self.setup, self.first_save, self.random_step, self.kill):
            self.events.append(event())
        return self.events
