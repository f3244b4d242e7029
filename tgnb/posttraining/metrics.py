"""Client-side metrics of a training session, one JSON line per record.

The server knows steps, policy versions and checkpoints; rewards live in the user's loop, and the
loss comes back in each forward-backward's answer. `MetricLog` keeps both, in memory and appended to
``<tgnb home>/posttraining/metrics/<session id>.jsonl``, so a panel opened in another cell (or
``%tg pt panel``) draws the same curves. Records: ``{"time", "step", <metric>: float, ...}`` and
``{"time", "step", "op": kind}`` for each operation sent through tgnb's trainer/generator.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class MetricLog:
    """The metrics of one session; thread-safe (a panel reads while the loop writes)."""

    def __init__(self, path: Path | None, step: int | None = None) -> None:
        """`step`: the session's step as the API says it now (it wins over the rows: a session
        rolled back to a checkpoint is at that checkpoint's step); None: the last row's."""
        self.path = path
        self.step = step or 0
        self.rows: list[dict[str, Any]] = []
        self.write_error: str | None = None  # why the file could not be written (kept in memory)
        self._lock = threading.Lock()
        if path is not None:
            self.rows = read(path)
            steps = [r["step"] for r in self.rows if isinstance(r.get("step"), int)]
            if step is None:
                self.step = max([0, *steps])

    def _append(self, row: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.rows.append(row)
            if self.path is not None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    with open(self.path, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(row, sort_keys=True) + "\n")
                except OSError as e:
                    # Bookkeeping must never break the training loop: keep the rows in memory.
                    self.write_error = f"{self.path}: {e}"
                    self.path = None
        return row

    def record(self, step: int | None = None, **values: float) -> dict[str, Any]:
        """Add metrics at `step` (default: the trainer's current step)."""
        return self._append(
            {"time": time.time(), "step": self.step if step is None else int(step), **values}
        )

    def operation(self, kind: str) -> None:
        self._append({"time": time.time(), "step": self.step, "op": kind})

    def set_step(self, step: int) -> None:
        """The step the API answered (never a count of this client's own: after a rollback the
        session's step goes down)."""
        with self._lock:
            self.step = int(step)

    # -- reading -------------------------------------------------------------------------------
    def series(self, key: str) -> list[tuple[float, float]]:
        """(step, value) of `key`, in the order recorded."""
        with self._lock:
            rows = list(self.rows)
        return [
            (float(r["step"]), float(r[key]))
            for r in rows
            if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float))
        ]

    def latest(self, key: str) -> float | None:
        s = self.series(key)
        return s[-1][1] if s else None

    def operations(self) -> int:
        with self._lock:
            return sum(1 for r in self.rows if "op" in r)


def read(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file (a torn last line is skipped)."""
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except OSError:  # none yet, or unreadable: the panel shows what the API knows
        pass
    return rows


def metrics_dir(home: Path) -> Path:
    """Where client-side session metrics are kept under the tgnb `home` (one JSONL file per
    session)."""
    return home / "posttraining" / "metrics"


__all__ = ["MetricLog", "metrics_dir", "read"]
