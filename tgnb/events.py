"""One event model for everything that happens to a cluster or a run.

Cluster events come from the API's ``node_lifecycle_events``; run events come from a training
process's ``events.jsonl`` (and the same records on stdout, prefixed with `STDOUT_PREFIX`).
The timeline, the widgets and the backends all speak `Event`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeGuard

# Reasons the platform emits in node_lifecycle_events.
NODE_ADDED = "TogetherNodeAdded"
PREEMPTION_NOTIFIED = "TogetherPreemptionNotified"
PREEMPTED = "TogetherPreempted"  # the node is removed at the end of the drain window
SCALED_DOWN = "TogetherScaledDown"
SCALED_UP = "TogetherScaledUp"
CLUSTER_REASONS = frozenset({NODE_ADDED, PREEMPTION_NOTIFIED, PREEMPTED, SCALED_DOWN, SCALED_UP})

# Reasons a training run emits (events.jsonl and stdout).
RUN_STARTED = "RunStarted"
RUN_RESUMED = "RunResumed"
SIGNAL_RECEIVED = "SignalReceived"
DRAIN_NOTICE = "DrainNoticeReceived"
CHECKPOINT_SAVED = "CheckpointSaved"
CHECKPOINT_FAILED = (
    "CheckpointFailed"  # a save failed (disk full...); the last complete one is kept
)
CHECKPOINT_REJECTED = "CheckpointRejected"  # failed verification at resume; moved aside
#: The run starts again: data["restart_count"], ["exit_code"]; ["moved"] true when the supervisor
#: stopped it on purpose to go back to preemptible nodes (no preemption: `%tg cost` counts none).
RUN_REQUEUED = "RunRequeued"
RUN_EXITED = "RunExited"
#: The periodic checkpoint interval in force, announced at an attempt's start and at each change
#: (`tgnb.train.interval`): data every_steps, every_s, was_steps, rule, stall_s, the rates, detail
CHECKPOINT_INTERVAL = "CheckpointIntervalChosen"
RUN_REASONS = frozenset(
    {
        RUN_STARTED,
        RUN_RESUMED,
        SIGNAL_RECEIVED,
        DRAIN_NOTICE,
        CHECKPOINT_SAVED,
        CHECKPOINT_FAILED,
        CHECKPOINT_REJECTED,
        RUN_REQUEUED,
        RUN_EXITED,
        CHECKPOINT_INTERVAL,
    }
)

# Reasons tgnb itself records (control plane).
TARGET_CHANGED = "TargetChanged"

# Reasons a workload backend records about a run's job (the local backend's supervisor).
#: The engine started the run's processes on a node: data["gpus"] (the node's GPUs it holds),
#: ["node_class"], ["restart_count"]. With `JOB_RELEASED` it is the engine's meter of the run
#: (`tgnb.runs.meter`): GPU-hours and dollars come from these two, for every program.
JOB_PLACED = "JobPlaced"
#: The run's processes on a node have ended and its GPUs are given back: data["exit_code"],
#: ["cause"] (one of `tgnb.runs.meter.CAUSES`: why the engine ended them or they ended).
JOB_RELEASED = "JobReleased"
SIGNAL_SENT = "SignalSent"  # SIGTERM to the job's processes at a preemption notice
JOB_KILLED = "JobKilled"  # SIGKILL when the node was removed
#: A recovery decision (`tgnb.runs.recovery.decide`): data["action"], ["nodes"], ["node_class"],
#: ["rule"]; the message is the decision's reason ("shrunk to 1 node: 8 of 16 preemptible GPUs
#: allocated for 10 min").
RECOVERY_DECIDED = "RecoveryDecided"
#: A failure counted against the budget: data["failures"], ["max_restarts"], ["backoff_s"].
RUN_FAILED_RESTARTING = "RunFailedRestarting"
#: A run's spending reached `tgnb.prices.NOTICE_FRACTION` of its budget: data["spent_usd"],
#: ["budget_usd"]; then, at the budget, BUDGET_REACHED and the run is stopped (it checkpoints).
BUDGET_NOTICE = "BudgetNotice"
BUDGET_REACHED = "BudgetReached"
JOB_REASONS = frozenset(
    {
        JOB_PLACED,
        JOB_RELEASED,
        SIGNAL_SENT,
        JOB_KILLED,
        RECOVERY_DECIDED,
        RUN_FAILED_RESTARTING,
        BUDGET_NOTICE,
        BUDGET_REACHED,
    }
)

# Reasons of a fault-tolerant run's replica groups (issue 50, `tgnb.runs.ft`), source "tgnb": the
# engine's (a group started or ended) and its reading of the lighthouse's quorums.
#: The run's coordinator is up: data["address"], ["heartbeat_timeout_ms"] (the survivors' wait
#: when a group vanishes without leaving).
LIGHTHOUSE_STARTED = "LighthouseStarted"
#: A group's processes started on a node: data["group"], ["replacement"] (True after a loss or a
#: move), ["node_class"] (its node's).
GROUP_JOINED = "GroupJoined"
#: A group's processes ended: data["group"], ["cause"] ("notice", "removed", "lost",
#: "finished", "stopped", "budget", "moved": back to a preemptible node, the local engine's
#: recovery policy), ["exit_code"]; the other groups go on.
GROUP_LEFT = "GroupLeft"
#: A group entered the quorum behind the others and took a live peer's weights: data["group"],
#: ["step"], ["source"] (the group it healed from), ["took_s"] (from its start to that quorum).
GROUP_HEALED = "GroupHealed"
#: The lighthouse formed a quorum of other groups: data["groups"], ["step"] (the run's step,
#: counted once), ["quorum_id"], ["waited_s"] (since the quorum before it).
QUORUM_CHANGED = "QuorumChanged"
GROUP_REASONS = frozenset(
    {LIGHTHOUSE_STARTED, GROUP_JOINED, GROUP_LEFT, GROUP_HEALED, QUORUM_CHANGED}
)

# Reasons of the Post-Training API's objects (source "posttraining"): a model resource's lifecycle,
# its training sessions' and their checkpoints. `Event.data` holds "resource" (its id), "session"
# (id) and "name" (the session's display name) where they apply.
RESOURCE_CREATED = "ModelResourceCreated"
RESOURCE_QUEUED = "ModelResourceQueued"  # waiting for GPUs (data["queue_position"])
RESOURCE_READY = "ModelResourceReady"
RESOURCE_STOPPED = "ModelResourceStopped"
RESOURCE_ERROR = "ModelResourceError"
SESSION_STARTED = "TrainingSessionStarted"
SESSION_STOPPED = "TrainingSessionStopped"
SESSION_EXPIRED = "TrainingSessionExpired"
SESSION_ERROR = "TrainingSessionError"
SESSION_CHECKPOINT = "TrainingSessionCheckpoint"  # data["kind"]: "training" | "inference"
#: A restart of the service put the session back to its last training checkpoint:
#: data["from_step"], data["to_step"], data["checkpoint"].
SESSION_ROLLED_BACK = "TrainingSessionRolledBack"
POST_TRAINING_REASONS = frozenset(
    {
        RESOURCE_CREATED,
        RESOURCE_QUEUED,
        RESOURCE_READY,
        RESOURCE_STOPPED,
        RESOURCE_ERROR,
        SESSION_STARTED,
        SESSION_STOPPED,
        SESSION_EXPIRED,
        SESSION_ERROR,
        SESSION_CHECKPOINT,
        SESSION_ROLLED_BACK,
    }
)

#: A line on a training process's stdout that starts with this is one JSON record for a backend.
STDOUT_PREFIX = "@tgnb "


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def parse_time(value: str | float | int | datetime) -> datetime:
    """Parse an RFC 3339 string, a POSIX timestamp or a datetime into an aware UTC datetime."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, (int, float)):
        dt = datetime.fromtimestamp(float(value), timezone.utc)
    else:
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


def maybe_time(value: Any) -> datetime | None:
    """`parse_time` of a timestamp a service record may hold (ISO text, a datetime); None when
    it is missing or unreadable."""
    if value is None or value == "":
        return None
    try:
        return parse_time(value)
    except (TypeError, ValueError, AttributeError):
        return None


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
#: Longest duration tgnb reads (an age, a timeout): ten years.
MAX_DURATION = timedelta(days=3650)


def is_duration(text: object) -> TypeGuard[str]:
    """Whether `text` is written as a duration (``90s``, ``15m``, ``2h``, ``1d`` or plain seconds),
    in range or not: the form `parse_duration` reads."""
    return isinstance(text, str) and _DURATION.fullmatch(text) is not None


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``2h``, ``1d`` or plain seconds (ASCII digits) as a timedelta, more than
    0 and at most `MAX_DURATION`; `ValueError` with the fix otherwise. The one duration parser of
    the magics and the Python API."""
    m = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"{str(text)[:40]!r} is not a duration: write e.g. 30m, 2h or 1d")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not 0 < seconds <= MAX_DURATION.total_seconds():
        raise ValueError(
            f"{text.strip()[:40]!r} is out of range: a duration is more than 0 and at most "
            f"{MAX_DURATION.days}d"
        )
    return timedelta(seconds=seconds)


def parse_since(since: datetime | timedelta | str | float | None) -> datetime | None:
    """A point in time from a datetime, an RFC 3339 string, a POSIX timestamp, or an age: a
    timedelta or a duration as `parse_duration` reads it (``"90s"``, ``"2h"``, ``"90"`` seconds:
    the forms ``%tg events --since`` takes). `ValueError` with the fix otherwise."""
    if since is None:
        return None
    if isinstance(since, timedelta):
        if not timedelta(0) <= since <= MAX_DURATION:
            raise ValueError(f"since={since!r} must be an age from 0 to {MAX_DURATION.days} days")
        return utcnow() - since
    if is_duration(since):
        try:
            return utcnow() - parse_duration(since)
        except ValueError as exc:
            raise ValueError(f"since={exc}") from None
    try:
        return parse_time(since)
    except (TypeError, ValueError):
        raise ValueError(
            f"since={since!r} is not a time: use a datetime, a timedelta or an age like '2h'"
        ) from None


def format_time(dt: datetime) -> str:
    """RFC 3339 in UTC with a trailing Z, as the API writes timestamps."""
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Event:
    """Something that happened at `time` to a node and/or a run.

    `source` is ``"cluster"`` for node lifecycle events, ``"run"`` for a training process's own
    records, ``"tgnb"`` for what tgnb did (a target change), ``"posttraining"`` for model
    resources and training sessions of the Post-Training API. `data` holds details such as the
    step, the checkpoint's bytes and duration, or the exit code.
    """

    time: datetime
    source: str
    reason: str
    message: str = ""
    node: str | None = None
    run: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str | None, str | None, str, str]:
        """Identity used to de-duplicate events fetched more than once."""
        return (self.source, self.node, self.run, self.reason, format_time(self.time))

    @property
    def is_preemption(self) -> bool:
        return self.reason == PREEMPTION_NOTIFIED

    @classmethod
    def from_lifecycle(cls, record: Mapping[str, Any]) -> Event:
        """Build from one ``node_lifecycle_events`` item: ``{node_id, reason, message, timestamp}``."""
        return cls(
            time=parse_time(record["timestamp"]),
            source="cluster",
            reason=str(record["reason"]),
            message=str(record.get("message") or ""),
            node=str(record["node_id"]),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "time": format_time(self.time),
            "source": self.source,
            "reason": self.reason,
            "message": self.message,
        }
        if self.node is not None:
            out["node"] = self.node
        if self.run is not None:
            out["run"] = self.run
        if self.data:
            out["data"] = dict(self.data)
        return out

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Event:
        return cls(
            time=parse_time(record["time"]),
            source=str(record.get("source", "run")),
            reason=str(record["reason"]),
            message=str(record.get("message") or ""),
            node=record.get("node"),
            run=record.get("run"),
            data=dict(record.get("data") or {}),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def dedupe(events: Iterable[Event], seen: set[tuple[Any, ...]] | None = None) -> list[Event]:
    """Drop events whose `key` is in `seen` (updated in place), sorted by time."""
    seen = set() if seen is None else seen
    out = []
    for ev in events:
        if ev.key in seen:
            continue
        seen.add(ev.key)
        out.append(ev)
    return sorted(out, key=lambda e: e.time)


#: Event times outside these years are a malformed record (a clock gone wrong, a typo).
_YEARS = (1970, 9000)


def from_record(record: Any) -> Event | None:
    """The `Event` of one record (an ``events.jsonl`` line, an ``@tgnb`` line), or None when it
    is not one: not an object, no ``reason`` or ``time``, a time that does not parse or lies
    outside 1970-9000, a field of the wrong type."""
    if not isinstance(record, Mapping):
        return None
    reason, source, data = record.get("reason"), record.get("source", "run"), record.get("data")
    if not isinstance(reason, str) or not reason or not isinstance(source, str):
        return None
    if not all(isinstance(record.get(k), (str, type(None))) for k in ("node", "run")):
        return None
    if data is not None and not isinstance(data, Mapping):
        return None
    stamp = record.get("time")
    if not isinstance(stamp, (str, int, float)) or isinstance(stamp, bool):
        return None
    try:
        ev = Event.from_dict(record)
    except (KeyError, ValueError, TypeError, OverflowError, OSError):
        return None
    if not _YEARS[0] <= ev.time.year <= _YEARS[1]:
        return None
    return ev


class EventLines(list[Event]):
    """Events read from lines, with `skipped`: how many lines were not an event."""

    skipped: int = 0


_log = logging.getLogger("tgnb.events")
#: (path, skipped) already reported, so a file read on every poll is reported once per change.
_REPORTED: set[tuple[str, int]] = set()


def read_lines(lines: Iterable[str], run: str | None = None, source: str = "") -> EventLines:
    """The events among JSON lines: a blank line or a torn last line is passed over, any other
    line that is not an event (not JSON, no ``time``, a bad time, ...) is skipped and counted
    (`EventLines.skipped`, and one warning on the ``tgnb.events`` logger naming `source`), never
    raised: one bad line must not hide the run's other events from any reader."""
    out = EventLines()
    pending_torn = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if pending_torn:  # a line that did not parse and was not the last: malformed
            out.skipped += 1
            pending_torn = False
        try:
            record = json.loads(line)
        except ValueError:
            pending_torn = True
            continue
        ev = from_record(record)
        if ev is None:
            out.skipped += 1
            continue
        if run is not None and ev.run is None:
            ev = Event(ev.time, ev.source, ev.reason, ev.message, ev.node, run, ev.data)
        out.append(ev)
    report_skipped(source, out.skipped)
    return out


def report_skipped(source: str, skipped: int) -> None:
    """One warning on the ``tgnb.events`` logger that `skipped` lines of `source` are not
    events, once per (source, count): a file read on every poll is reported once per change."""
    if skipped and (source, skipped) not in _REPORTED:
        _REPORTED.add((source, skipped))
        _log.warning(
            "skipped %d malformed line(s) of %s (not an event: no time or reason, or a bad value)",
            skipped,
            source or "events",
        )


def read_jsonl(path: Any, run: str | None = None) -> EventLines:
    """Events from an ``events.jsonl`` file (`read_lines`: malformed lines are skipped and
    counted, a torn last line passed over); an empty list when the file does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return read_lines(fh, run=run, source=str(path))
    except FileNotFoundError:
        return EventLines()


def program_text(line: str) -> str | None:
    """`line` without tgnb's ``@tgnb`` record (None when nothing else is left). A record can
    follow the program's own text on one line: a progress bar ends with a carriage return."""
    at = line.find(STDOUT_PREFIX + "{")
    if at < 0:
        return line
    head = line[:at]
    return head if head.strip() else None


def metrics_row(record: Any) -> dict[str, Any] | None:
    """`record` as a metrics row (one optimizer step: what `tgnb.train.record.Recorder.metric`
    writes), or None when it is not one: not an object, ``step`` not a whole number >= 0, or a
    value that is not a finite number (a bool, a string, NaN)."""
    if not isinstance(record, Mapping):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    for value in record.values():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None
    return dict(record)


def parse_record(line: str) -> dict[str, Any] | None:
    """The JSON record of an ``@tgnb`` stdout line (after any text on the same line), or None
    for any other line."""
    at = line.find(STDOUT_PREFIX + "{")
    if at < 0:
        return None
    try:
        rec = json.loads(line[at + len(STDOUT_PREFIX) :])
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None
