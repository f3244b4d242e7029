"""A run's record files read incrementally: each poll parses only the lines appended since the last.

A notebook, the server extension and `tgnb.sweep` poll a run every second or so, and a long run's
``events.jsonl`` / ``metrics.jsonl`` hold 100k lines: reading them whole at each poll made a poll's
cost grow with the run's age. Here one `Appended` per file keeps its byte offset, and the records
parsed so far are kept between polls (in this process, for the files last read, bounded by
`KEPT`): a poll reads the new bytes only, whichever `tgnb.runs.Run` object asks (a `Session.run`
builds a new one each time).

What is read is what `tgnb.events.read_jsonl` reads, record for record: a line that does not
parse and is followed by another line is malformed (skipped and counted); an unfinished last line
(no newline yet) is parsed on each read, and kept only once its newline is written. A file
replaced or truncated (a new inode, or shorter than what was read) is read again from its start.

A run whose directory is not on this machine (a remote Slurm job's, a Kubernetes pod's) gives its
records as ``@tgnb`` lines of its output, which its engine returns after a cursor
(``backend.logs_after(job_id, cursor)`` -> `LogChunk`: a Slurm job's byte offset into its output
file, a Kubernetes pod's last timestamp): `engine_records` keeps the records parsed so far per
backend and job, so a poll fetches and parses only the lines written since the last.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.events import (
    Event,
    EventLines,
    from_record,
    metrics_row,
    parse_record,
    report_skipped,
)

#: How many files' parsed records are kept between polls (least recently read dropped first).
KEPT = 128


class Appended:
    """The lines appended to one file since the last `read`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._ident: tuple[int, int] | None = None
        self._tail = b""

    def read(self) -> tuple[list[str], str, bool]:
        """``(lines, unfinished, restarted)``: the complete lines written since the last read,
        the last line as written so far without its newline (``""`` when none), and whether the
        file was replaced or truncated, so that what was read before must be dropped (the lines
        returned are then the whole file's)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            restarted = self.offset > 0 or bool(self._tail)
            self.offset, self._ident, self._tail = 0, None, b""
            return [], "", restarted
        ident = (st.st_dev, st.st_ino)
        restarted = self._ident is not None and (ident != self._ident or st.st_size < self.offset)
        if restarted or self._ident is None:
            self.offset, self._tail = 0, b""
        self._ident = ident
        data = b""
        if st.st_size > self.offset:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
            self.offset += len(data)
        *complete, self._tail = (self._tail + data).split(b"\n")
        return (
            [c.decode("utf-8", errors="replace") for c in complete],
            self._tail.decode("utf-8", errors="replace"),
            restarted,
        )


class _Parsed:
    """One file's records so far: complete lines parsed once, the unfinished one on each read."""

    def __init__(self, path: Path, run: str | None) -> None:
        self.file = Appended(path)
        self.run = run
        self.lock = threading.Lock()
        self.records: list[Any] = []
        self.rows: list[dict[str, Any]] = []  # the records that are metrics rows, checked once
        self._rows_upto = 0  # how many of `records` were checked for `rows`
        self.events = EventLines()
        self.seen: set[tuple[Any, ...]] = set()
        self._bad_last = False  # the last complete line did not parse: malformed once one follows

    def update(self) -> tuple[Any, Event | None, int]:
        """Read what was appended; return the unfinished line's record and event (None when
        it does not parse or is not an event) and how many more lines are malformed once the
        unfinished one is counted as read (a full read of the file as it is now counts them)."""
        lines, unfinished, restarted = self.file.read()
        if restarted:
            self.records, self.events, self.seen, self._bad_last = [], EventLines(), set(), False
            self.rows, self._rows_upto = [], 0
        for line in lines:
            self._take(line)
        more = int(self._bad_last and bool(unfinished.strip()))
        record = _loads(unfinished)
        if record is None:
            return None, None, more
        ev = self._event(record)
        return record, ev, more + int(ev is None)

    def _take(self, line: str) -> None:
        text = line.strip()
        if not text:
            return
        if self._bad_last:  # a line that did not parse and was not the last: malformed
            self.events.skipped += 1
            self._bad_last = False
        record = _loads(text)
        if record is None:
            self._bad_last = True
            return
        self.records.append(record)
        ev = self._event(record)
        if ev is None:
            self.events.skipped += 1
        elif ev.key not in self.seen:
            self.seen.add(ev.key)
            bisect.insort(self.events, ev, key=lambda e: e.time)

    def _event(self, record: Any) -> Event | None:
        ev = from_record(record)
        if ev is not None and self.run is not None and ev.run is None:
            ev = Event(ev.time, ev.source, ev.reason, ev.message, ev.node, self.run, ev.data)
        return ev


def _loads(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


_KEPT: OrderedDict[tuple[str, str | None], _Parsed] = OrderedDict()
_KEPT_LOCK = threading.Lock()


def _parsed(path: Path, run: str | None) -> _Parsed:
    key = (str(path), run)
    with _KEPT_LOCK:
        parsed = _KEPT.get(key)
        if parsed is None:
            parsed = _KEPT[key] = _Parsed(path, run)
            while len(_KEPT) > KEPT:
                _KEPT.popitem(last=False)
        else:
            _KEPT.move_to_end(key)
        return parsed


def records(path: Path) -> list[Any]:
    """Every JSON value among `path`'s lines so far, in file order (a malformed line passed
    over); [] when the file does not exist."""
    parsed = _parsed(path, None)
    with parsed.lock:
        record, _, _ = parsed.update()
        out = list(parsed.records)
    if record is not None:
        out.append(record)
    return out


def rows(path: Path) -> list[dict[str, Any]]:
    """The metrics rows among `path`'s records so far (`tgnb.events.metrics_row`: one bad
    record is passed over), in file order, each a copy the caller may change."""
    parsed = _parsed(path, None)
    with parsed.lock:
        record, _, _ = parsed.update()
        for rec in parsed.records[parsed._rows_upto :]:
            if (row := metrics_row(rec)) is not None:
                parsed.rows.append(row)
        parsed._rows_upto = len(parsed.records)
        out = [dict(row) for row in parsed.rows]
    if (row := metrics_row(record)) is not None:
        out.append(row)
    return out


def events(path: Path, run: str | None = None) -> EventLines:
    """The events of an ``events.jsonl`` file so far, de-duplicated and by time, as
    `tgnb.events.read_jsonl` followed by `tgnb.events.dedupe` gives them (an event without a
    run is given `run`); `EventLines.skipped` counts the malformed lines, reported once on the
    ``tgnb.events`` logger as `read_jsonl` reports them."""
    parsed = _parsed(path, run)
    with parsed.lock:
        _, unfinished, more = parsed.update()
        out = EventLines(parsed.events)
        out.skipped = parsed.events.skipped + more
        if unfinished is not None and unfinished.key not in parsed.seen:
            bisect.insort(out, unfinished, key=lambda e: e.time)
    report_skipped(str(path), out.skipped)
    return out


@dataclass(frozen=True)
class LogChunk:
    """What an engine returns after a cursor: the complete `lines` written since, the
    `unfinished` last line as written so far (``""``: none; read again next time), the `cursor`
    the next read starts from, whether the output was replaced (`restarted`: `lines` are then
    all of it) and how many bytes were fetched (`read`)."""

    lines: list[str]
    cursor: Any
    unfinished: str = ""
    restarted: bool = False
    read: int = 0


def split_appended(data: bytes, offset: int) -> LogChunk:
    """The `LogChunk` of `data`, the bytes of an append-only file from byte `offset` on: its
    complete lines, and a cursor just past the last of them (the unfinished line is read again)."""
    *complete, tail = data.split(b"\n")
    return LogChunk(
        [c.decode("utf-8", errors="replace") for c in complete],
        offset + len(data) - len(tail),
        tail.decode("utf-8", errors="replace"),
        read=len(data),
    )


@dataclass
class _Logged:
    """One job's ``@tgnb`` records read from its engine's output so far: the metrics rows and
    event records, and the events de-duplicated and by time (parsed once each)."""

    cursor: Any = None
    found: dict[str, list[Any]] = field(default_factory=lambda: {"metrics": [], "events": []})
    events: list[Event] = field(default_factory=list)
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    read: int = 0  # bytes fetched from the engine, all polls together
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the raw lines a follower of the log was given: how many, and the engine's cursor after them
    shown: int = 0
    shown_cursor: Any = None

    def update(self, fetch: Callable[[Any], LogChunk]) -> dict[str, list[Any]]:
        """Fetch what was written since the cursor and parse it; the unfinished line's records
        (parsed again next time)."""
        chunk = fetch(self.cursor)
        if chunk.restarted:
            self.found, self.events, self.seen = {"metrics": [], "events": []}, [], set()
        for kind, recs in _take(chunk.lines).items():
            self.found[kind].extend(recs)
            if kind == "events":
                for ev in (from_record(r) for r in recs):
                    if ev is not None and ev.key not in self.seen:
                        self.seen.add(ev.key)
                        bisect.insort(self.events, ev, key=lambda e: e.time)
        self.cursor, self.read = chunk.cursor, self.read + chunk.read
        return _take([chunk.unfinished] if chunk.unfinished else [])


def _take(lines: list[str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"metrics": [], "events": []}
    for line in lines:
        rec = parse_record(line)
        kind = None if rec is None else rec.pop("kind", None)
        if kind == "metrics":
            if (row := metrics_row(rec)) is not None:
                out["metrics"].append(row)
        elif kind == "events" and isinstance(rec, dict):
            out["events"].append(rec)
    return out


_ENGINES: weakref.WeakKeyDictionary[Any, OrderedDict[str, _Logged]] = weakref.WeakKeyDictionary()


def engine_log(backend: Any, job_id: str) -> _Logged:
    """What was read of `job_id`'s output through `backend` so far (kept while the backend
    lives, for its `KEPT` jobs last read)."""
    with _KEPT_LOCK:
        jobs = _ENGINES.setdefault(backend, OrderedDict())
        logged = jobs.get(job_id)
        if logged is None:
            logged = jobs[job_id] = _Logged()
            while len(jobs) > KEPT:
                jobs.popitem(last=False)
        else:
            jobs.move_to_end(job_id)
        return logged


def _fetch(backend: Any, job_id: str) -> Callable[[Any], LogChunk]:
    return lambda after: backend.logs_after(job_id, after)


def engine_records(backend: Any, job_id: str, kind: str) -> list[dict[str, Any]]:
    """The `kind` (``metrics`` or ``events``) records among `job_id`'s ``@tgnb`` output lines so
    far, fetching only what was written since the last call (``backend.logs_after(job_id,
    cursor)``); each a copy the caller may change."""
    logged = engine_log(backend, job_id)
    with logged.lock:
        unfinished = logged.update(_fetch(backend, job_id))
        out = [dict(r) for r in logged.found.get(kind, [])]
    return out + unfinished.get(kind, [])


def engine_events(backend: Any, job_id: str) -> list[Event]:
    """The events among `job_id`'s ``@tgnb`` output lines so far, de-duplicated and by time (as
    `tgnb.events.dedupe` gives them), each parsed once: only what was written since the last
    call is fetched."""
    logged = engine_log(backend, job_id)
    with logged.lock:
        unfinished = logged.update(_fetch(backend, job_id))
        out = list(logged.events)
        seen = logged.seen
    for ev in (from_record(r) for r in unfinished["events"]):
        if ev is not None and ev.key not in seen:
            bisect.insort(out, ev, key=lambda e: e.time)
    return out


def engine_lines(backend: Any, job_id: str, line: int, finished: bool) -> list[str] | None:
    """The raw output lines of `job_id` after its first `line` ones, fetched after the engine's
    cursor when `line` is where the last call for this job ended (a follower of the log, page
    after page) or 0; None for any other `line` (the caller reads the output whole). The last
    line without its newline is given once the job has `finished`, not before."""
    logged = engine_log(backend, job_id)
    with logged.lock:
        if line == 0:
            logged.shown, logged.shown_cursor = 0, None
        elif line != logged.shown:
            return None
        chunk: LogChunk = backend.logs_after(job_id, logged.shown_cursor)
        logged.read += chunk.read
        if chunk.restarted and line:
            logged.shown = -1
            return None  # the output was replaced: the follower's line numbers mean nothing now
        lines = list(chunk.lines)
        logged.shown, logged.shown_cursor = line + len(lines), chunk.cursor
        if finished and chunk.unfinished:
            lines.append(chunk.unfinished)
            logged.shown = -1  # past the engine's cursor: a next page reads the output whole
        return lines
