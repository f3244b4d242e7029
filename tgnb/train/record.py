"""What a run leaves: ``events.jsonl`` and ``metrics.jsonl`` in its run directory, and the same
records on stdout as JSON lines prefixed with `tgnb.events.STDOUT_PREFIX` so a backend can follow a
run through its logs. Only rank 0 writes. Secrets are masked here, where the records are written
(`tgnb.config.scrub`, the node's secrets registered by `tgnb.config.register_node_secrets`): an
error line holding a token is stored as ``***``, on shared storage too. Light (no torch, no transformers): a plain loop
(`tgnb.train.Checkpointer`) records through it without importing transformers.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tgnb.config import register_node_secrets, scrub_record
from tgnb.events import RUN_EXITED, RUN_STARTED, STDOUT_PREFIX, Event, utcnow

#: The columns of every ``metrics.jsonl`` row that tgnb writes itself (the step, the time).
METRIC_COLUMNS = ("step", "time")


def rank() -> int:
    """This process's global rank as torchrun sets it (0 outside torchrun): the one lookup."""
    return int(os.environ.get("RANK", "0"))


def _close_all(files: dict[str, IO[str]]) -> None:
    for fh in files.values():
        fh.close()
    files.clear()


class Recorder:
    """Appends events and metrics of one run. Each line is written and flushed whole (from any
    thread: the asynchronous save records its checkpoint while the main thread logs metrics).

    The two files stay open in append mode (a metrics row comes at every logged step) until
    `close`, or until the recorder is collected."""

    def __init__(self, run_dir: str | os.PathLike[str], run: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run = run or self.run_dir.name
        self.node = os.environ.get("TGNB_NODE") or os.environ.get("SLURMD_NODENAME") or None
        self.enabled = rank() == 0
        self._lock = threading.Lock()
        self._files: dict[str, IO[str]] = {}
        self._finalizer = weakref.finalize(self, _close_all, self._files)
        #: Called with (file name, record) after each record is written (`tgnb.train.tracker`).
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        if self.enabled:
            register_node_secrets()  # the run's declared secrets and the look-alikes, masked
            self.run_dir.mkdir(parents=True, exist_ok=True)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = scrub_record(record)
        line = json.dumps(record, sort_keys=True)  # the stdout line: the same, kind first
        out = f'{STDOUT_PREFIX}{{"kind": "{name[:-6]}", {line[1:]}\n' if record else ""
        with self._lock:
            fh = self._files.get(name)
            if fh is None:
                fh = self._files[name] = open(self.run_dir / name, "a", encoding="utf-8")  # noqa: SIM115
            fh.write(line + "\n")
            fh.flush()
            sys.stdout.write(out)
            sys.stdout.flush()
        for listener in self.listeners:
            listener(name, record)

    def close(self) -> None:
        """Close the files (a later record opens them again)."""
        with self._lock:
            _close_all(self._files)

    def event(self, reason: str, message: str = "", **data: Any) -> Event:
        ev = Event(utcnow(), "run", reason, message, node=self.node, run=self.run, data=data)
        self._append("events.jsonl", ev.to_dict())
        return ev

    def engine_event(self, reason: str, message: str = "", **data: Any) -> Event:
        """An event of the engine's side of the node (source ``"tgnb"``): the node's own meter
        on Slurm and Kubernetes (`tgnb.train.budget.held`)."""
        ev = Event(utcnow(), "tgnb", reason, message, node=self.node, run=self.run, data=data)
        self._append("events.jsonl", ev.to_dict())
        return ev

    def metric(self, step: int, /, **values: Any) -> None:
        """One ``metrics.jsonl`` row: `step`, the time, then `values` (a value named like one
        of the row's own `METRIC_COLUMNS` is left out: the row's step and time are tgnb's)."""
        row = {k: v for k, v in values.items() if k not in METRIC_COLUMNS}
        self._append("metrics.jsonl", {"step": step, "time": time.time(), **row})


def number(value: Any) -> float | int | None:
    """`value` as a metrics number (ints, floats, 0-d tensors, numpy scalars), or None when it is
    not one or not finite."""
    if isinstance(value, int):
        return int(value)  # a bool as 0 or 1
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def run_started(recorder: Recorder, **data: Any) -> None:
    """Record ``RunStarted`` (before the guard looks for a checkpoint to resume from)."""
    what = f"{data.get('algorithm', '')} on {data.get('model', '')}".strip()
    recorder.event(RUN_STARTED, f"started {what}".strip(), **data)


def run_failed(recorder: Recorder, error: BaseException, step: int | None) -> None:
    """Record ``RunExited`` for a run that ended with an exception (exit code 1, or 78 for one
    every start would repeat: `tgnb.runs.outcome.repeats`)."""
    from tgnb.runs.node import Exit
    from tgnb.runs.outcome import repeats

    first = str(error).splitlines()[0] if str(error) else ""
    recorder.event(
        RUN_EXITED,
        f"failed: {type(error).__name__}: {first}"[:500],
        exit_reason="failed",
        exit_code=int(Exit.REPEATS if repeats(error) else Exit.FAILED),  # as the CLI exits
        step=step,
    )
