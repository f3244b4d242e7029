"""The chaos schedule for a fault-tolerant program (``certify(..., fault_tolerance="torchft")``):
the run is replica groups under a TorchFT lighthouse (`tgnb.runs.ft`), and each event hits ONE
group, chosen at random, never the run: a preemption of its node through the emulator (the engine
sends that group SIGTERM, as on any notice), or a SIGKILL of its processes with no notice. After
each event certify waits until the group's replacement is back in a quorum (healed from a live
peer, or entered with the others) before the next one, so one event's cost is not another's.

Which of certify's events apply (`FT_KINDS`), and why the others are left out (`LEFT_OUT`): a
preemption while a save is in flight tests a checkpoint's resume, and a replacement group never
resumes from a checkpoint (it heals from a peer; the periodic save of one group is for a
whole-run loss only); a shrink is what ``min_nodes`` does to a run that restarts as a whole, and
replica groups never restart together (every event leaves the survivors training at fewer groups).

The step of a moment is the quorum's (the lighthouse's log, `tgnb.backends.local.quorums`): it
holds for any program on TorchFT's ``Manager``, whether it calls tgnb's hook or not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tgnb.backends.local.groups import LIGHTHOUSE_LOG
from tgnb.backends.local.quorums import Quorum, group_of, parse
from tgnb.certify.chaos import KINDS, Driver, Fired
from tgnb.events import GROUP_HEALED, GROUP_JOINED, Event
from tgnb.runs import ft

#: certify's events that a run as replica groups is driven through, in order.
FT_KINDS = ("setup", "random-step", "kill")
#: the others, and why they are left out of a fault-tolerant run's schedule.
LEFT_OUT = {
    "first-save": "not for replica groups: a replacement heals from a live peer and never loads "
    "a checkpoint (one group's periodic save is for losing every group at once)",
    "shrink": "not for replica groups: they never restart together, so there is no run to shrink "
    "(min_nodes is refused); each event already leaves the survivors at fewer groups",
}


def quorums(run_dir: Path | None) -> list[Quorum]:
    """Every quorum the run's lighthouse formed, in order (its log in the run directory)."""
    path = run_dir / LIGHTHOUSE_LOG if run_dir is not None else None
    if path is None or not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    return [q for q in map(parse, text.splitlines()) if q is not None]


def groups_in(q: Quorum) -> set[int]:
    return {g for g in map(group_of, q.members) if g is not None}


def left_out(only: Sequence[str]) -> list[tuple[str, str]]:
    """The events not driven for replica groups, with why."""
    out = [(kind, "left out (events=...)") for kind in KINDS if kind not in only]
    return out + [(kind, why) for kind, why in LEFT_OUT.items() if kind in only]


@dataclass
class GroupDriver(Driver):
    """Drives `FT_KINDS` on the replica groups of `run` (`nodes`: its groups)."""

    def _quorums(self) -> list[Quorum]:
        return quorums(self.run.run_dir)

    def _last_step(self) -> int | None:
        qs = self._quorums()
        return max(q.step for q in qs) if qs else None

    def _joined(self) -> dict[int, Event]:
        """Each group's latest start (``GroupJoined``)."""
        out: dict[int, Event] = {}
        for e in self.run.run_events():
            if e.reason == GROUP_JOINED and isinstance(e.data.get("group"), int):
                out[int(e.data["group"])] = e
        return out

    def _all_in(self) -> bool:
        """Every group is in the newest quorum: the run is at full strength."""
        qs = self._quorums()
        return bool(qs) and len(groups_in(qs[-1])) == self.nodes

    def _target(self, ev: Fired) -> str | None:
        """Choose the group `ev` hits; its node (None: not known yet)."""
        joined = self._joined()
        ev.group = self.rng.randrange(self.nodes)
        e = joined.get(ev.group)
        return e.node if e is not None else None

    def _preempt_group(self, ev: Fired) -> Callable[[], str]:
        def act() -> str:
            node = self._target(ev)
            if node is None:
                return f"group {ev.group}'s node is not known (no GroupJoined)"
            self.session.preempt(node)
            return ""

        return act

    def _kill_group(self, ev: Fired) -> Callable[[], str]:
        def act() -> str:
            self._target(ev)
            pids = self._group_pids(ev.group)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    # its launcher's process group; torchrun's workers run in sessions of
                    # their own: the engine kills what is left of the group once it ends
                    os.killpg(pid, signal.SIGKILL)
            return "" if pids else f"no process of group {ev.group} was found to kill"

        return act

    def _group_pids(self, group: int | None) -> list[int]:
        """The engine's processes of group `group` (each the leader of its process group), by
        the `tgnb.runs.ft.REPLICA_GROUP_ENV` the engine gave it."""
        jobs = self.run.refresh().jobs
        want = f"{ft.REPLICA_GROUP_ENV}={group}".encode()
        out = []
        for pid in (jobs[-1].info.get("children") or []) if jobs else []:
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{int(pid)}/environ").read_bytes().split(b"\0")
                if want in env:
                    out.append(int(pid))
        return out

    def _hit(self, ev: Fired, act: Callable[[], str]) -> None:
        """Fire `act` (it says why it could not act: the event is then NOT DONE), then wait for
        the group's replacement."""
        ev.at_step = self._last_step()
        ev.fired_at = time.time()
        why = act()
        if why:
            ev.fired_at, ev.note = None, why
            return
        self._back(ev)

    def _back(self, ev: Fired) -> None:
        """Wait until group `ev.group`'s replacement is back in a quorum (healed, or entered with
        the others), the run has ended, or the budget ran out."""
        while time.monotonic() < self.until and not self.run.status.state.finished:
            joined = self._joined().get(ev.group) if ev.group is not None else None
            if joined is not None and joined.time.timestamp() > (ev.fired_at or 0):
                since = joined.time.timestamp()
                if any(e.reason == GROUP_HEALED and e.data.get("group") == ev.group
                       and e.time.timestamp() >= since for e in self.run.run_events()):  # fmt: skip
                    return
                if any(q.created >= since and ev.group in groups_in(q) for q in self._quorums()):
                    return
            time.sleep(0.2)

    # -- the events ---------------------------------------------------------------------------
    def setup(self) -> Fired:
        ev = Fired("setup", "preemption of one group during setup, before the first step")
        why = self._wait(lambda: len(self._joined()) == self.nodes, 0.05)
        if why:
            ev.note = why
        elif self._quorums():
            ev.note = "the groups were training before certify saw them all started"
        else:
            self._hit(ev, self._preempt_group(ev))
            if ev.done:
                ev.label = f"preemption of group {ev.group} during setup, before the first step"
        return ev

    def _at_steps(self, ev: Fired, act: Callable[[Fired], Callable[[], str]]) -> Fired:
        k = self.rng.randint(2, 6)
        why = self._wait(self._all_in)  # the replacement of the event before is in
        start = self._last_step() or 0
        why = why or self._wait(lambda: (self._last_step() or 0) >= start + k and self._all_in())
        if why:
            ev.note = why
        else:
            ev.note = f"{k} steps after every group was in the quorum"
            self._hit(ev, act(ev))
            ev.label = ev.label.replace("one group", f"group {ev.group}")
        return ev

    def random_step(self) -> Fired:
        ev = Fired("random-step", "preemption of one group with notice at a random step")
        return self._at_steps(ev, self._preempt_group)

    def kill(self) -> Fired:
        ev = Fired("kill", "kill of one group with no notice (SIGKILL)")
        return self._at_steps(ev, self._kill_group)

    def schedule(self, only: Sequence[str] = FT_KINDS) -> list[Fired]:
        events = {"setup": self.setup, "random-step": self.random_step, "kill": self.kill}
        for kind in FT_KINDS:
            if kind in only:
                self.events.append(events[kind]())
        return self.events
