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
With ``--remote``, the run's records are instead the ``@tgnb`` lines of a Slurm job's output file
(a run whose directory is not on this machine), read through `SlurmBackend` on this machine:
- before: each poll reads the output whole (`SlurmBackend.logs`) and parses every record, the
  way `Run.records` / `Run.run_events` read a remote run until the engines took a cursor;
- after: `tgnb.runs.cursor.engine_records` / `engine_events` over `SlurmBackend.logs_after`: the
  bytes after the last offset only (over SSH only those are sent).
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
from typing import Any

from tgnb.events import STDOUT_PREFIX, dedupe, from_record, metrics_row, parse_record, read_jsonl
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


JOB = "4242"


class Remote:
    """A Slurm job's output file with the run's records as ``@tgnb`` lines, and its backend."""

    def __init__(self, root: Path, n: int) -> None:
        from tgnb.backends.slurm import SlurmBackend

        self.run_dir = Path(tempfile.mkdtemp(dir=root))
        self.backend = SlurmBackend(runs_root=root, gres=False)
        self.backend.attach(JOB, self.run_dir)
        self.out = self.run_dir / f"slurm-{JOB}.out"
        self.out.write_text("".join(self.lines(i) for i in range(n)))

    @staticmethod
    def lines(i: int) -> str:
        ev = json.loads(event(i))
        return (f"step {i}\n{STDOUT_PREFIX}{json.dumps({'kind': 'events', **ev})}\n"
                f"{STDOUT_PREFIX}{json.dumps({'kind': 'metrics', **json.loads(metric(i))})}\n")  # fmt: skip

    def append(self, i: int) -> None:
        with open(self.out, "a") as fh:
            fh.write(self.lines(i))


def remote_before(r: Remote) -> int:
    found: dict[str, list[dict[str, object]]] = {"metrics": [], "events": []}
    for line in r.backend.logs(JOB):
        rec = parse_record(line)
        if rec is not None and (kind := rec.pop("kind", None)) in found:
            found[str(kind)].append(rec)
    rows = [row for rec in found["metrics"] if (row := metrics_row(rec)) is not None]
    evs = dedupe(e for e in (from_record(rec) for rec in found["events"]) if e is not None)
    return len(evs) + len(rows)


def remote_after(r: Remote) -> int:
    return len(cursor.engine_events(r.backend, JOB)) + len(
        cursor.engine_records(r.backend, JOB, "metrics")
    )


def make_run(root: Path, n: int) -> Path:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    (run_dir / "events.jsonl").write_text("".join(event(i) for i in range(n)))
    (run_dir / "metrics.jsonl").write_text("".join(metric(i) for i in range(n)))
    return run_dir


def cpu_per_poll(read: Callable[[Any], int], run: Any, start: int, polls: int) -> float:
    """The median CPU seconds of one poll, over `polls` polls after the first, each after one
    more event and metrics row were appended (the first poll, which reads whole, not counted)."""
    read(run)
    times = []
    for k in range(polls):
        if isinstance(run, Remote):
            run.append(start + k)
        else:
            with open(run / "events.jsonl", "a") as fe, open(run / "metrics.jsonl", "a") as fm:
                fe.write(event(start + k))
                fm.write(metric(start + k))
        t = time.process_time()
        count = read(run)
        times.append(time.process_time() - t)
        assert count == 2 * (start + k + 1), count
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--polls", type=int, default=5)
    ap.add_argument("--remote", action="store_true", help="a Slurm job's output, not run files")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        old, new = [], []
        for _ in range(a.rounds):
            if a.remote:
                old.append(cpu_per_poll(remote_before, Remote(root, a.events), a.events, a.polls))
                new.append(cpu_per_poll(remote_after, Remote(root, a.events), a.events, a.polls))
            else:
                old.append(cpu_per_poll(before, make_run(root, a.events), a.events, a.polls))
                new.append(cpu_per_poll(after, make_run(root, a.events), a.events, a.polls))
    med_old, med_new = statistics.median(old), statistics.median(new)
    what = "a Slurm job's output" if a.remote else "run files"
    print(f"poll of a run with {a.events:,} events and {a.events:,} metrics rows ({what}), CPU s "
          f"per poll, median of {a.rounds} rounds x {a.polls} polls; load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    print(
        f"  before (whole {'output' if a.remote else 'files'} each poll): {med_old * 1e3:9.2f} ms"
    )
    print(f"  after  (after a cursor):       {med_new * 1e3:9.2f} ms")
    print(f"  before / after: {med_old / max(med_new, 1e-9):.0f}x")


if __name__ == "__main__":
    main()
