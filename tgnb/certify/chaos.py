"""The chaos schedule: what certify does to the interrupted run, one event per attempt, each
driven for real on the local engine (a preemption through the emulator, a SIGKILL to the training
process), and the attempt's end observed before the next event.

Each event waits for its moment (placed; a save in flight; a step), fires, and records when. A
preemption is the emulator's (the node gets its notice and is drained) and, at the same moment, the
SIGTERM the engine sends the program on a notice, sent by certify itself: the engine polls the node
every second or so, and a signal that late would miss the moment chosen (a save in flight lasts
milliseconds). A shrink (a run certified on several nodes that may run on fewer) is a preemption
whose node is not replaced, the cluster's capacity capped for the while. An event whose moment
never comes (the run finished first, the budget ran out, no save was ever seen
in flight) is reported NOT DONE with why: certify never claims an event it did not cause.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tgnb.errors import ValidationError
from tgnb.events import RECOVERY_DECIDED
from tgnb.runs.node import CHECKPOINTS
from tgnb.runs.run import Run
from tgnb.train import checkpoint as ck

#: The events of the schedule, in the order they are driven.
KINDS = ("setup", "first-save", "random-step", "kill", "shrink")
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
    group: int | None = None  # the replica group it hit (a fault-tolerant run, `groupchaos`)

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
    nodes: int = 1  # the nodes the run asks for
    shrinks: bool = False  # the run may shrink (nodes > min_nodes): drive the shrink event
    events: list[Fired] = field(default_factory=list)
    _kept: tuple[str, ...] = ()  # the run's nodes a shrink leaves it

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
        """SIGKILL the training processes of the attempt, each node's whole process group (a
        launcher's workers too, which the launcher's own death would leave training): no
        notice, no save."""
        self._signal(signal.SIGKILL, group=True)

    def _signal(self, sig: signal.Signals, group: bool = False) -> None:
        jobs = self.run.refresh().jobs
        for pid in (jobs[-1].info.get("children") or []) if jobs else []:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if group:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(int(pid), sig)
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

    def _at_new_steps(
        self, ev: Fired, act: Callable[[], None], also: Callable[[], bool] = lambda: True
    ) -> Fired:
        k = self.rng.randint(2, 6)
        t0 = time.time()
        why = self._wait(lambda: (len(self._steps_since(t0)) >= k or self._no_hook()) and also())
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

    def shrink(self) -> Fired:
        """Preempt one of the run's nodes with no replacement granted: once the reference has
        ended and no node is being provisioned, the cluster's preemptible capacity is capped
        (nothing new comes up) and the nodes the run does not hold are preempted too, so the restart finds fewer free nodes than the run
        asks for and its recovery policy shrinks it. The cap is lifted once the run is placed
        again; the event is NOT DONE unless the placement was a shrink."""
        ev = Fired("shrink", "preemption with no replacement: a shrink to fewer nodes")
        cid, emulator = self.session.cluster.id, self.session.emulator
        try:
            self._at_new_steps(ev, lambda: self._starve_and_preempt(ev), self._shrink_moment)
            if not ev.done and not self.reference.state.finished:
                ev.note += " (a shrink waits for the uninterrupted run to end)"
            if ev.done:
                self._placed_again(ev.restart or 0)
        finally:
            emulator.set_capacity(cid, None)
        starts = [e for e in self.run.run_events() if e.reason == RECOVERY_DECIDED
                  and e.data.get("action") == "start" and e.time.timestamp() > (ev.fired_at or 0)]  # fmt: skip
        if ev.done and (not starts or starts[0].data.get("rule") != "shrink"):
            ev.fired_at = None
            ev.note = "the run was not placed on fewer nodes afterwards" + (
                f" ({starts[0].message})" if starts else ""
            )
        elif ev.done:
            ev.note += f"; resumed on {starts[0].data.get('nodes')} of {self.nodes} nodes"
        return ev

    def _shrink_moment(self) -> bool:
        """The reference has ended (its nodes, freed, would take the run back) and no node is on
        its way (the cap stops new ones, not those already provisioning)."""
        if not self.reference.state.finished:
            return False
        nodes = self.session.status().preemptible_nodes
        return not any(n.phase in ("PENDING", "BOOTING") for n in nodes)

    def _starve_and_preempt(self, ev: Fired) -> None:
        """Cap the capacity, preempt the free nodes and one of the run's, then the SIGTERM (after
        the notice here: the restart must not be placed before the node is seen preempted); the
        event's step is the one logged when the SIGTERM goes."""
        self.session.emulator.set_capacity(self.session.cluster.id, 0)
        self._kept = tuple(self.run.status.nodes[1:])
        self._starve()
        ev.at_step = self._last_step()
        self._signal(signal.SIGTERM)

    def _starve(self) -> None:
        """Preempt every running preemptible node but the run's kept ones."""
        for n in self.session.status().preemptible_nodes:
            if n.name not in self._kept and n.phase == "RUNNING" and n.status != "Draining":
                with contextlib.suppress(ValidationError):  # already draining
                    self.session.preempt(n.name)

    def _placed_again(self, restart: int) -> None:
        while time.monotonic() < self.until:
            st = self.run.status
            if st.state.finished or (st.restart_count > restart and st.state.value == "running"):
                return
            time.sleep(0.1)

    def schedule(self, only: Sequence[str] = KINDS) -> list[Fired]:
        """Drive the events of `only` (`KINDS`, in that order; the shrink only if it `shrinks`)."""
        events = {"setup": self.setup, "first-save": self.first_save,
                  "random-step": self.random_step, "kill": self.kill, "shrink": self.shrink}  # fmt: skip
        for kind in KINDS:
            if kind in only and (kind != "shrink" or self.shrinks):
                self.events.append(events[kind]())
        return self.events
