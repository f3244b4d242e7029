"""`tgnb.runs.cursor`: a run's record files read incrementally give what a whole read gives.

Every case compares against `tgnb.events.read_jsonl` + `dedupe` (the whole-file read the cursor
replaces) on the same file, after each of a series of appends, torn writes, a truncation and a
replacement; and a `Run` is read through a fresh object on each poll, as `Session.run` makes one.
"""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tgnb.events import dedupe, metrics_row, read_jsonl
from tgnb.runs import cursor

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)


def event_line(i: int, reason: str = "Checkpointed", dup_of: int | None = None) -> str:
    n = i if dup_of is None else dup_of
    rec = {"time": (T0 + timedelta(seconds=n * 37 % 10007)).isoformat(), "source": "run",
           "reason": reason, "message": f"e{n}", "data": {"step": n}}  # fmt: skip
    return json.dumps(rec) + "\n"


def whole(path: Path, run: str | None = "r") -> tuple[list[Any], int]:
    lines = read_jsonl(path, run=run)
    return [e.to_dict() for e in dedupe(lines)], lines.skipped


def incremental(path: Path, run: str | None = "r") -> tuple[list[Any], int]:
    lines = cursor.events(path, run=run)
    return [e.to_dict() for e in lines], lines.skipped


def write(path: Path, text: str, mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as fh:
        fh.write(text)


@pytest.mark.parametrize("seed", range(6))
def test_events_read_in_pieces_are_the_whole_files_events(tmp_path: Path, seed: int) -> None:
    """Random appends: whole lines, a line torn in two writes, blank lines, malformed lines,
    records that are not events, duplicates and events out of time order."""
    rng = random.Random(seed)
    path = tmp_path / f"events-{seed}.jsonl"
    assert incremental(path) == ([], 0)  # no file yet
    pending = ""
    for i in range(120):
        choice = rng.random()
        if choice < 0.6:
            text = event_line(i)
        elif choice < 0.7:
            text = event_line(i, dup_of=rng.randrange(max(i, 1)))
        elif choice < 0.78:
            text = "{not json\n"
        elif choice < 0.85:
            text = json.dumps({"reason": "NoTime"}) + "\n"
        elif choice < 0.9:
            text = "\n"
        else:
            text = json.dumps([1, 2]) + "\n"
        pending += text
        if rng.random() < 0.4:
            cut = rng.randrange(len(pending) + 1)  # a write that stops mid-line
            write(path, pending[:cut])
            pending = pending[cut:]
            assert incremental(path) == whole(path), i
    write(path, pending)
    assert incremental(path) == whole(path)
    assert len(incremental(path)[0]) > 40


def test_a_truncated_or_replaced_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write(path, "".join(event_line(i) for i in range(30)))
    assert len(incremental(path)[0]) == 30
    write(path, "".join(event_line(i) for i in range(5)), mode="w")  # truncated: shorter
    assert incremental(path) == whole(path) and len(whole(path)[0]) == 5
    other = tmp_path / "new.jsonl"
    write(other, "".join(event_line(i) for i in range(100, 140)))
    os.replace(other, path)  # replaced: another inode, longer
    assert incremental(path) == whole(path) and len(whole(path)[0]) == 40
    path.unlink()
    assert incremental(path) == ([], 0)


def test_an_unfinished_last_line_counts_only_once_its_newline_is_written(tmp_path: Path) -> None:
    """A last line without its newline is read on each poll (a writer that died mid-line
    leaves its last complete record readable as the whole read does), never kept twice."""
    path = tmp_path / "events.jsonl"
    line = event_line(1)
    write(path, line[:-1])  # complete JSON, no newline yet
    assert incremental(path) == whole(path) and len(whole(path)[0]) == 1
    write(path, "\n" + event_line(2)[:20])  # the newline, then half of the next
    assert incremental(path) == whole(path) and len(whole(path)[0]) == 1
    write(path, event_line(2)[20:])
    assert incremental(path) == whole(path) and len(whole(path)[0]) == 2


def test_metrics_rows_are_the_whole_files_rows_and_copies(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "loss": 1.0 / (i + 1)} for i in range(50)]
    bad = [{"step": -1}, {"step": "3"}, {"step": 4, "loss": "x"}]
    write(path, "".join(json.dumps(r) + "\n" for r in rows[:20] + bad))
    write(path, "".join(json.dumps(r) + "\n" for r in rows[20:]) + '{"step": 99, "lo')
    got = cursor.rows(path)
    lines = path.read_text().splitlines()
    expected = [r for ln in lines if ln.endswith("}") for r in [metrics_row(json.loads(ln))] if r]
    assert got == expected == rows
    got[0]["loss"] = -5.0  # the caller's copy: what the next poll returns is untouched
    assert cursor.rows(path)[0]["loss"] == 1.0
    assert cursor.records(path)[-1] == rows[-1]  # the torn line is not a record


def test_a_second_poll_reads_only_what_was_appended(tmp_path: Path) -> None:
    """`Session.run` builds a new `Run` per call: the parsed records are kept per file, not per
    object, so the second poll reads only the bytes appended after the first (its offset)."""
    path = tmp_path / "events.jsonl"
    write(path, "".join(event_line(i) for i in range(1000)))
    first = cursor.events(path, run="r")
    size = path.stat().st_size
    write(path, event_line(5000))
    parsed = cursor._parsed(path, "r")
    assert parsed.file.offset == size  # what the first poll read
    second = cursor.events(path, run="r")
    assert parsed.file.offset == path.stat().st_size
    assert len(second) == len(first) + 1
    assert [e.message for e in second if e.message not in {f.message for f in first}] == ["e5000"]
