"""What a fault-tolerant run's lighthouse says, read from its log (issue 50): each quorum TorchFT's
lighthouse forms (``Quorum! Quorum { quorum_id: .., participants: [..], created: .. }``, one per
step), turned into the run's events when its groups change: `QUORUM_CHANGED` (the groups in it,
the run's step counted once, how long since the quorum before it: the survivors' stall) and
`GROUP_HEALED` for a group that entered behind the others (TorchFT then sends it a live peer's
weights). The lighthouse's log is the engine's own record of the quorum: this reads any program
that uses TorchFT's `Manager`, tgnb's Checkpointer or not.

`StepRows` gives a program that records no steps of its own (TorchFT's `Manager` alone, never
importing tgnb) the run's steps as the quorum counts them: ``metrics.jsonl`` rows, so that the
summary, the sidebar and a deadline's progress know them (not "steps unknown").
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.events import GROUP_HEALED, QUORUM_CHANGED, RUN_STARTED
from tgnb.runs import cursor

_QUORUM = re.compile(
    r"Quorum! Quorum \{ quorum_id: (\d+), participants: \[(.*)\], "
    r"created: Some\(Timestamp \{ seconds: (\d+), nanos: (\d+)"
)
_MEMBER = re.compile(r'replica_id: "([^"]*)".*?step: (\d+)')
_DIGITS = re.compile(r"(\d+)$")


def group_of(replica_id: str) -> int | None:
    """The group index of a TorchFT replica id (``NAME<i>:<uuid>``, as the Manager names it):
    the trailing digits of its name, None without."""
    m = _DIGITS.search(replica_id.split(":", 1)[0])
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Quorum:
    quorum_id: int
    members: dict[str, int]  # replica id -> its step when it asked
    created: float  # epoch seconds

    @property
    def step(self) -> int:
        return max(self.members.values(), default=0)


def parse(line: str) -> Quorum | None:
    """The quorum a lighthouse log line announces, or None."""
    m = _QUORUM.search(line)
    if m is None:
        return None
    members = {rid: int(step) for rid, step in _MEMBER.findall(m.group(2))}
    return Quorum(int(m.group(1)), members, int(m.group(3)) + int(m.group(4)) / 1e9)


@dataclass
class QuorumReader:
    """Follows the lighthouse's log at `path` and emits the run's events through `emit` (reason,
    message, data). `started`: group index -> when its processes started (epoch s), for a heal's
    time."""

    path: Path
    emit: Callable[[str, str, dict[str, Any]], None]
    started: Mapping[int, float] = field(default_factory=dict)
    #: called with every quorum read (`StepRows.seen`)
    each: Callable[[Quorum], None] | None = None
    offset: int = 0
    last: Quorum | None = None
    rest: bytes = b""
    quorums: int = 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        for raw in lines:
            q = parse(raw.decode("utf-8", "replace"))
            if q is not None:
                self.seen(q)

    def seen(self, q: Quorum) -> None:
        self.quorums += 1
        if self.each is not None:
            self.each(q)
        before = self.last
        self.last = q
        if before is not None and set(before.members) == set(q.members):
            return
        groups = sorted(g for g in map(group_of, q.members) if g is not None)
        waited = round(q.created - before.created, 3) if before is not None else 0.0
        self.emit(
            QUORUM_CHANGED,
            f"quorum {q.quorum_id}: groups {groups} at step {q.step}"
            + (f" ({waited:.1f} s after the last)" if before is not None else ""),
            {"groups": groups, "step": q.step, "quorum_id": q.quorum_id, "waited_s": waited},
        )
        ahead = [rid for rid, step in q.members.items() if step == q.step]
        source = group_of(sorted(ahead)[0]) if ahead else None
        for rid, step in q.members.items():
            group = group_of(rid)
            if step >= q.step or group is None or (before and rid in before.members):
                continue
            start = self.started.get(group)
            took = round(q.created - start, 3) if start is not None else None
            self.emit(
                GROUP_HEALED,
                f"group {group} healed from group {source} at step {q.step}"
                + (f", {took:.1f} s after it started" if took is not None else ""),
                {
                    "group": group,
                    "step": q.step,
                    "source": source,
                    "took_s": took,
                    "from_step": step,
                },
            )


#: The column of `StepRows`' rows: the replica groups in the step's quorum.
GROUPS_COLUMN = "replica_groups"


@dataclass
class StepRows:
    """The run's steps as its lighthouse counts them, appended to its ``metrics.jsonl``
    (`metrics`) as ``{"step", "time", "replica_groups"}`` rows for a program that writes none
    of its own: at most one every `every_s` seconds of quorums, and the last at the end
    (`flush`). A quorum at step k starts the groups' step k + 1: the step a row gives is the
    steps committed when the quorum formed, and at a run's successful end the last quorum's step
    + 1 (its step was committed before the group finished). Once the program records its own
    ``RunStarted`` in `events` (tgnb's Checkpointer or protect: it writes its own rows), none is
    written."""

    metrics: Path
    events: Path
    every_s: float = 1.0
    written: int = -1
    at: float = 0.0
    last: Quorum | None = None
    hooked: bool = False

    def seen(self, q: Quorum) -> None:
        self.last = q
        if q.created - self.at >= self.every_s:
            self.flush()

    def flush(self, finished: bool = False) -> None:
        q = self.last
        if q is None or self._hooked():
            return
        step = q.step + 1 if finished else q.step
        if step <= self.written:
            return
        row = {"step": step, "time": time.time() if finished else q.created,
               GROUPS_COLUMN: len(q.members)}  # fmt: skip
        fd = os.open(self.metrics, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:  # one write of one line: never interleaved with another writer's
            os.write(fd, (json.dumps(row) + "\n").encode())
        finally:
            os.close(fd)
        self.written, self.at = step, q.created

    def _hooked(self) -> bool:
        if not self.hooked and self.events.exists():
            evs = cursor.events(self.events)
            self.hooked = any(e.reason == RUN_STARTED and e.source == "run" for e in evs)
        return self.hooked
