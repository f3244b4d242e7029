"""The notebook's CPU per poll of a long run: whole-file reads against the incremental cursor.

    python bench/poll.py [--events 100000] [--rounds 5] [--polls 5]

A run directory with `--events` events and as many metrics rows; between two polls the run
appends one event and one metrics row, as a training run does. A poll reads what the notebook's
panel and `Run.wait` read: the metrics rows and the de-duplicated events. Measured side by side
in this one run, interleaved round by round, in CPU seconds of this process (`time.process_time`):
- before: each poll reads both files whole (`tgnb.events.read_jsonl` + `dedupe`, and every metrics
  line parsed and checked), the way `tgnb.runs.Run` read them until the cursor;
- after: `tgnb.runs.cursor` (`Run.records` / `Run.run_events` now): the first poll reads the files
  whole, each later one reads the appended lines only.
Prints the medians per poll, their ratio and the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tgnb.events import dedupe, metrics_row, read_jsonl
from tgnb.runs import cursor

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)


def event(i: int) -> str:
    rec = {"time": (T0 + timedelta(seconds=i)).isoformat(), "source": "run",
           "reason": "StepLogged", "message": f"step {i}", "data": {"step": i}}  # fmt: skip
    return json.dumps(rec) + "\n"


def metric(i: int) -> str:
    return json.dumps({"step": i, "loss": 1.0 / (i + 1), "reward": i % 7, "time": 1e9 + i}) + "\n"


def before(run_dir: Path) -> int:
    evs = dedupe(read_jsonl(run_dir / "events.jsonl", run="r"))
    rows = []
    with open(run_dir / "metrics.jsonl", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (row := metrics_row(rec)) is not None:
                rows.append(row)
    return len(evs) + len(rows)


def after(run_dir: Path) -> int:
    evs = cursor.events(run_dir / "events.jsonl", run="r")
    rows = cursor.rows(run_dir / "metrics.jsonl")
    return len(evs) + len(rows)


def make_run(root: Path, n: int) -> Path:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    (run_dir / "events.jsonl").write_text("".join(event(i) for i in range(n)))
    (run_dir / "metrics.jsonl").write_text("".join(metric(i) for i in range(n)))
    return run_dir


def cpu_per_poll(read: Callable[[Path], int], run_dir: Path, start: int, polls: int) -> float:
    """The median CPU seconds of one poll, over `polls` polls after the first, each after one
    more event and metrics row were appended (the first poll, which reads whole, not counted)."""
    read(run_dir)
    times = []
    for k in range(polls):
        with open(run_dir / "events.jsonl", "a") as fe, open(run_dir / "metrics.jsonl", "a") as fm:
            fe.write(event(start + k))
            fm.write(metric(start + k))
        t = time.process_time()
        count = read(run_dir)
        times.append(time.process_time() - t)
        assert count == 2 * (start + k + 1), count
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--polls", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        old, new = [], []
        for _ in range(a.rounds):
            old.append(cpu_per_poll(before, make_run(root, a.events), a.events, a.polls))
            new.append(cpu_per_poll(after, make_run(root, a.events), a.events, a.polls))
    med_old, med_new = statistics.median(old), statistics.median(new)
    print(f"poll of a run with {a.events:,} events and {a.events:,} metrics rows, CPU s per poll, "
          f"median of {a.rounds} rounds x {a.polls} polls; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"  before (whole files each poll): {med_old * 1e3:9.2f} ms")
    print(f"  after  (tgnb.runs.cursor):      {med_new * 1e3:9.2f} ms")
    print(f"  before / after: {med_old / max(med_new, 1e-9):.0f}x")


if __name__ == "__main__":
    main()
