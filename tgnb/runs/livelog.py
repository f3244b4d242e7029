"""A run's output followed live across its attempts: ``run.logs(follow=True)`` and ``%tg logs RUN
-f``.

Each attempt's output begins with the marker its node's top tgnb process prints (an ``@tgnb``
record of kind `ATTEMPT`: `tgnb.train.attempt`); where one is read, a header line says which
attempt starts, on which node(s), when, and how the one before it ended, from the engine's own
records of each attempt (``JobPlaced`` / ``JobReleased`` and its ``cause``: `tgnb.runs.meter`),
the marker's own node and time standing in until the engine's record is read. The program's lines
follow as written, each once; a last line says how the run ended. Ctrl-C (KeyboardInterrupt)
stops following and leaves the run alone.

`page` is the same view read a page at a time after a cursor, for a reader that polls (the
JupyterLab sidebar's live log, ``GET /tgnb/runs/<name>/logs``): each line marked as an attempt's
header, the program's output or the run's end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO

from tgnb.events import Event, parse_record, parse_time, program_text
from tgnb.runs import meter, node
from tgnb.runs.cursor import engine_lines

#: The ``kind`` of the ``@tgnb`` record that starts each attempt's output (`tgnb.train.attempt`).
ATTEMPT = "attempt"
#: Set by a node's top tgnb process once it printed its attempt's marker (reserved: a run's
#: ``env`` may not set it).
MARKED_ENV = node.ATTEMPT_MARKED_ENV
#: What a header line starts with (``── attempt 2 on node-3, started 12:00:05Z; ...``).
HEADER = "── attempt "
#: How long a header waits for the engine's record of its attempt (the marker may be read first).
PLACED_WAIT_S = 2.0
#: How an attempt ended (`tgnb.runs.meter.CAUSES`), in words.
ENDED = {
    meter.DONE: "done",
    meter.FAILED: "failed",
    meter.PREEMPTED: "preempted",
    meter.SIGNALLED: "stopped by a signal",
    meter.BUDGET: "stopped at the budget",
    meter.CANCELLED: "cancelled",
    meter.MOVED: "moved back to preemptible nodes",
    meter.LOST: "its node was lost",
}


class Followed(Protocol):
    """What is read of a `tgnb.runs.run.Run` here (it imports this module)."""

    @property
    def name(self) -> str: ...
    def follow(self, records: bool = ..., poll: float = ..., raw: bool = ...) -> Iterator[Any]: ...
    def run_events(self) -> list[Event]: ...
    def refresh(self) -> Any: ...
    def closing_line(self) -> str: ...


def _utc(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%H:%M:%SZ")


def header(run: Followed, marker: dict[str, Any], live: bool = True) -> str:
    """The header line of the attempt `marker` starts (its ``restart_count``: attempt n + 1)."""
    count = marker.get("restart_count")
    count = count if isinstance(count, int) and not isinstance(count, bool) else 0
    deadline = time.monotonic() + (PLACED_WAIT_S if live else 0.0)
    while True:
        stretches = meter.stretches(run.run_events())
        mine = [s for s in stretches if s.attempt == count]
        if mine or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    nodes = sorted({s.node for s in mine}) or [str(marker.get("node") or "?")]
    if mine:
        started = _utc(datetime.fromtimestamp(min(s.start for s in mine), timezone.utc))
    else:
        try:
            started = _utc(parse_time(str(marker.get("time"))))
        except ValueError:
            started = "?"
    line = f"{HEADER}{count + 1} on {', '.join(nodes)}, started {started}"
    before = [s for s in stretches if s.attempt < count]
    if count > 0:
        last = max((s.attempt for s in before), default=None)
        causes = sorted({s.cause for s in before if s.attempt == last})
        ended = ", ".join(ENDED.get(c, c) for c in causes) or "ended"
        line += f"; attempt {count}: {ended}"
    return f"{line} ──"


def lines(run: Followed, poll: float = 0.2, raw: bool = False) -> Iterator[str]:
    """The run's output from its start, as it is written, until the run has ended: a header line
    before each attempt's output (`header`), the program's lines (tgnb's ``@tgnb`` records left
    out unless `raw`), and a last line with the run's end (`Run.closing_line`)."""
    seen: set[int] = set()
    for line in run.follow(raw=True, poll=poll):
        record = parse_record(line)
        if record is not None and record.get("kind") == ATTEMPT:
            count = record.get("restart_count")
            if isinstance(count, int) and count not in seen:
                seen.add(count)
                yield header(run, record, live=not run.refresh().state.finished)
        if raw:
            yield line
        elif (text := program_text(line)) is not None:
            yield text
    yield f"── {run.closing_line()} ──"


def show(run: Followed, poll: float = 0.2, raw: bool = False, out: TextIO | None = None) -> None:
    """Print `lines` as they come (to `out`, default stdout) until the run has ended; Ctrl-C
    stops following and leaves the run alone."""
    out = out or sys.stdout
    try:
        for line in lines(run, poll, raw):
            print(line, file=out, flush=True)
    except KeyboardInterrupt:
        print(f"(stopped following {run.name}; the run goes on)", file=out, flush=True)


#: Most bytes of a log one `page` reads (a longer log takes more pages), unless its first line
#: is longer: that line is read whole, up to `LINE_BYTES`.
PAGE_BYTES = 256 * 1024
LINE_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Page:
    """What a run's log holds after a cursor: `lines` as ``(kind, text)`` with kind ``attempt``
    (a `header`), ``output`` (the program's line) or ``end`` (the run's closing line, once, on the
    last page); `cursor` and `attempt` to pass to the next `page`; `done` once the run has ended
    and every line was read (nothing will follow)."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    cursor: int = 0
    attempt: int = -1
    done: bool = False


def _raw_after(run: Any, cursor: int, finished: bool) -> tuple[list[str], int, bool]:
    """The raw lines after `cursor`, the cursor after them, and whether the log was read to its
    end. The run directory's log (on this machine) is read from byte `cursor`, whole lines only
    until the run has finished, at most `PAGE_BYTES` (or one longer line); for a log only its
    backend reads (a pod's, a remote job's) `cursor` counts its lines, and the next page is
    fetched after the engine's own cursor (`tgnb.runs.cursor.engine_lines`; read whole when the
    engine has none, or for a page that is not the next one)."""
    d = run.run_dir
    path = None if d is None else d / node.LOG
    if path is None or not path.parent.is_dir():
        job = run.record.job_id
        if run.backend is None or not job:
            return [], cursor, True
        if hasattr(run.backend, "logs_after"):
            new = engine_lines(run.backend, job, cursor, finished)
            if new is not None:
                return new, cursor + len(new), True
        every = list(run.backend.logs(job, follow=False))
        return every[cursor:], len(every), True
    if not path.exists():
        return [], cursor, True
    with open(path, "rb") as fh:
        fh.seek(cursor)
        data = fh.read(PAGE_BYTES)
        while b"\n" not in data and len(data) < LINE_BYTES and (more := fh.read(PAGE_BYTES)):
            data += more  # a first line longer than a page is read whole
        at_end = not fh.read(1)
    cut = data.rfind(b"\n") + 1
    if (finished and at_end) or (cut == 0 and len(data) >= LINE_BYTES):
        cut = len(data)  # the last line, written without a newline; or a line too long, in pieces
    text = data[:cut].decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines, cursor + cut, at_end and cut == len(data)


def page(run: Any, cursor: int = 0, attempt: int = -1, raw: bool = False) -> Page:
    """The run's log after `cursor` as `lines` shows it (a header before each attempt after
    `attempt`, the last attempt already headed; the program's lines; the closing line once the
    run has ended), without waiting: a header is written from what is recorded when it is read.
    Start with ``page(run)`` and pass the returned `Page`'s `cursor` and `attempt` back."""
    finished = run.refresh().state.finished  # read before the log: no line written after it
    raws, cursor, at_end = _raw_after(run, max(0, cursor), finished)
    out: list[tuple[str, str]] = []
    for line in raws:
        record = parse_record(line)
        if record is not None and record.get("kind") == ATTEMPT:
            count = record.get("restart_count")
            if isinstance(count, int) and not isinstance(count, bool) and count > attempt:
                attempt = count
                out.append(("attempt", header(run, record, live=False)))
        if raw:
            out.append(("output", line))
        elif (text := program_text(line)) is not None:
            out.append(("output", text))
    done = finished and at_end
    if done:
        out.append(("end", f"── {run.closing_line()} ──"))
    return Page(out, cursor, attempt, done)


__all__ = [
    "ATTEMPT",
    "ENDED",
    "HEADER",
    "MARKED_ENV",
    "PAGE_BYTES",
    "Page",
    "header",
    "lines",
    "page",
    "show",
]
