"""What a run leaves: ``events.jsonl`` and ``metrics.jsonl`` in its run directory, and the same
records on stdout as JSON lines prefixed with `tgnb.events.STDOUT_PREFIX` so a backend can follow a
run through its logs. Only rank 0 writes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tgnb.events import STDOUT_PREFIX, Event, utcnow


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Recorder:
    """Appends events and metrics of one run. Each line is written and flushed whole (from any
    thread: the immediate saver records its checkpoint while the main thread logs metrics)."""

    def __init__(self, run_dir: str | os.PathLike[str], run: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run = run or self.run_dir.name
        self.node = os.environ.get("TGNB_NODE") or os.environ.get("SLURMD_NODENAME") or None
        self.enabled = _rank() == 0
        self._lock = threading.Lock()
        if self.enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(record, sort_keys=True)
        out = f"{STDOUT_PREFIX}{json.dumps({'kind': name[:-6], **record})}\n"
        with self._lock:
            with open(self.run_dir / name, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
            sys.stdout.write(out)
            sys.stdout.flush()

    def event(self, reason: str, message: str = "", **data: Any) -> Event:
        ev = Event(utcnow(), "run", reason, message, node=self.node, run=self.run, data=data)
        self._append("events.jsonl", ev.to_dict())
        return ev

    def metric(self, step: int, **values: Any) -> None:
        self._append("metrics.jsonl", {"step": step, "time": time.time(), **values})
