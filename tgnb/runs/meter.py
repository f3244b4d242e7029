"""The engine's meter of a run: which nodes' GPUs it held, from when to when, and why each was given
back, read from the engine's own ``JobPlaced`` / ``JobReleased`` events.

Money and time come from what the engine ran, not from what the program says: a program that never
calls `tgnb.train.protect` or the `Checkpointer` records nothing of its own, and is metered the
same. Who records the two events (source ``"tgnb"``):

- the local engine's supervisor, around the processes it starts on each emulated node
  (`tgnb.backends.local.supervisor`);
- on Slurm and Kubernetes, the node's own top tgnb process (``python -m tgnb.train`` or
  ``python -m tgnb.train.launch``, `tgnb.train.budget.held`), once per node and attempt, around
  the program it runs; the engine renders the node's GPUs into its environment (`node.GPUS_ENV`).

A stretch whose release was never recorded (the node vanished with its processes, SIGKILL) ends at
the first of: the engine's ``JobKilled`` for its node, the engine's ``RunRequeued``, the next
placement of the run on that node or of a later attempt, or `until` (now, or the run's end).

A fault-tolerant run's replica groups (issue 50) are placed and released one by one, each
``JobPlaced`` carrying its ``group``: a group's node is held from its placement to its release,
a replacement's from its own placement (the gap between them held nothing), and a group placed
again ends only its own earlier stretch, never the survivors' (on Slurm each group of the array
has its own restart count). The lighthouse holds no GPU and is never placed: it costs nothing
here (`docs/replica-groups.md`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgnb import events as ev
from tgnb.events import Event, utcnow
from tgnb.prices import node_class

#: Why a node's processes ended (``JobReleased``'s ``cause``).
DONE, FAILED, PREEMPTED, SIGNALLED, BUDGET, CANCELLED, MOVED, LOST = (
    "done",  # the program exited 0
    "failed",  # it exited with an error of its own
    "preempted",  # the engine saw the node's preemption notice (or the program exited 75)
    "signalled",  # a SIGTERM the node's process cannot attribute (Kubernetes: drain or delete)
    "budget",  # stopped at the run's budget
    "cancelled",  # stopped by the user (or the engine going away)
    "moved",  # stopped on purpose to go back to preemptible nodes
    "lost",  # no release recorded: the node went with its processes
)
CAUSES = (DONE, FAILED, PREEMPTED, SIGNALLED, BUDGET, CANCELLED, MOVED, LOST)
#: Causes that end an attempt the way a preemption does, when a later attempt follows.
_RESTARTED = (PREEMPTED, SIGNALLED, LOST)


@dataclass(frozen=True)
class Stretch:
    """One node's GPUs held by the run: `gpus` of class `node_class` from `start` to `end` (epoch
    seconds), in attempt `attempt`, given back for `cause`."""

    node: str
    node_class: str
    gpus: int
    start: float
    end: float
    attempt: int
    cause: str
    #: the replica group it ran (a fault-tolerant run's), None for a run of one group
    group: int | None = None

    @property
    def gpu_hours(self) -> float:
        return max(self.end - self.start, 0.0) * self.gpus / 3600


def release_cause(kind: str, budget_stop: bool, moving: bool) -> str:
    """Why an engine gave back an attempt's nodes (one of `CAUSES`), from how the attempt
    ended (``succeeded``, ``failed``, ``cancelled`` or a ``requeue``): a cancel is the budget's
    when the budget stopped it, a requeue a move when the engine stopped it to go back to
    preemptible nodes, else a preemption."""
    if kind == "cancelled":
        return BUDGET if budget_stop else CANCELLED
    if kind == "succeeded":
        return DONE
    if kind == "failed":
        return FAILED
    return MOVED if moving else PREEMPTED


def metered(events: Iterable[Event]) -> bool:
    """Whether the engine metered this run (it recorded a ``JobPlaced``)."""
    return any(e.reason == ev.JOB_PLACED and e.source == "tgnb" for e in events)


def stretches(events: Iterable[Event], until: float | None = None) -> list[Stretch]:
    """The run's node stretches from the engine's events, oldest first; the open ones end at
    `until` (default now)."""
    end_now = utcnow().timestamp() if until is None else until
    out: list[Stretch] = []
    # node -> start, gpus, class, attempt, group
    open_: dict[str, tuple[float, int, str, int, int | None]] = {}
    attempt = -1

    def close(node: str, t: float, cause: str) -> None:
        start, gpus, cls, att, group = open_.pop(node)
        out.append(Stretch(node, cls, gpus, start, max(t, start), att, cause, group))

    for e in sorted(events, key=lambda e: e.time):
        if e.source != "tgnb":
            continue
        t, data = e.time.timestamp(), e.data or {}
        if e.reason == ev.JOB_PLACED and e.node:
            restart = data.get("restart_count")
            group = data.get("group")
            group = group if isinstance(group, int) and not isinstance(group, bool) else None
            if isinstance(restart, int) and not isinstance(restart, bool):
                new = restart
            else:  # a new attempt when nothing of the last one is still placed
                new = attempt + 1 if not open_ else attempt
            for name, o in list(open_.items()):
                # a group placed again ends its own earlier stretch only, never another group's
                mine = o[3] < new if group is None else o[4] == group
                if name == e.node or mine:
                    close(name, t, LOST)
            attempt = max(attempt, new)
            gpus = _int(data.get("gpus"), 0)
            cls = str(data.get("node_class") or node_class(e.node))
            open_[e.node] = (t, gpus, cls, new, group)
        elif e.reason == ev.JOB_RELEASED and e.node in open_:
            cause = str(data.get("cause") or "")
            close(e.node, t, cause if cause in CAUSES else FAILED)
        elif e.reason == ev.JOB_KILLED and e.node in open_:
            close(e.node, t, LOST)
        elif e.reason == ev.RUN_REQUEUED:
            for name in list(open_):
                close(name, t, LOST)
    for name in list(open_):
        close(name, end_now, "open")
    return sorted(out, key=lambda s: (s.start, s.node))


def preempted_attempts(runs: list[Stretch]) -> list[int]:
    """The attempts that ended as a preemption does: the engine saw a notice, or a SIGTERM or a
    lost node was followed by another attempt (the run started again). A replica group's
    stretches are not attempts of the run (`preempted_groups`)."""
    runs = [s for s in runs if s.group is None]
    last = max((s.attempt for s in runs), default=-1)
    out = []
    for att in sorted({s.attempt for s in runs}):
        causes = {s.cause for s in runs if s.attempt == att}
        if PREEMPTED in causes or (causes & set(_RESTARTED) and att < last):
            out.append(att)
    return out


def preempted_groups(runs: list[Stretch]) -> list[Stretch]:
    """The replica groups' stretches that ended as a preemption does: the engine saw a notice,
    or a SIGTERM or a lost node was followed by the same group placed again. One preemption
    each: the other groups trained on, the run did not start again."""
    out = []
    for s in runs:
        if s.group is None:
            continue
        again = any(o.group == s.group and o.start >= s.end for o in runs if o is not s)
        if s.cause == PREEMPTED or (s.cause in _RESTARTED and again):
            out.append(s)
    return out


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def append(run_dir: str | os.PathLike[str], event: Event) -> None:
    """Append the engine's `event` to the run's ``events.jsonl`` (one line, one write)."""
    line = event.to_json() + "\n"
    with open(Path(run_dir) / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(line)


def engine_event(run: str, reason: str, message: str, node: str, **data: Any) -> Event:
    """An event of the engine's (source ``"tgnb"``) about run `run` on `node`, timed now."""
    return Event(utcnow(), "tgnb", reason, message, node=node, run=run, data=data)


__all__ = [
    "CAUSES",
    "Stretch",
    "append",
    "engine_event",
    "metered",
    "preempted_attempts",
    "preempted_groups",
    "stretches",
]
