"""The run store's sweeps: named groups of runs (`SweepRecord`), two tables of the same sqlite
file (`SWEEP_SCHEMA`), written and read by `SweepTables`, which `tgnb.runs.store.RunStore`
is. A run forgotten (`RunStore.delete`) leaves its sweeps."""

from __future__ import annotations

import builtins
import re
import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from tgnb.errors import NotFoundError, ValidationError

SWEEP_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
  name TEXT PRIMARY KEY,
  cluster_id TEXT,
  created_at REAL NOT NULL,
  source TEXT NOT NULL DEFAULT '',
  metric TEXT,
  mode TEXT NOT NULL DEFAULT 'max'
);
CREATE TABLE IF NOT EXISTS sweep_runs (
  sweep TEXT NOT NULL REFERENCES sweeps(name),
  run_id TEXT NOT NULL REFERENCES runs(id),
  position INTEGER NOT NULL,
  PRIMARY KEY (sweep, run_id)
);
"""

#: A sweep's name, as a run's: it goes in URLs and on %tg lines.
_SWEEP_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?")
#: How a sweep's best metric is read: the largest value or the smallest.
SWEEP_MODES = ("max", "min")


def check_sweep_name(name: object) -> str:
    """`name` when it is a valid sweep name; else a `ValidationError` naming the fix."""
    if not isinstance(name, str) or not _SWEEP_NAME.fullmatch(name):
        raise ValidationError(
            f"sweep name {name!r:.40} is not valid: use lowercase letters, digits and '-' "
            "(at most 64 characters), e.g. 'lr-grid'"
        )
    return name


@dataclass(frozen=True)
class SweepRecord:
    """A sweep: a named group of runs (ids, in the order they joined), where it came from
    (``map``, ``grid``, ``notebooks``), and the metric its best value is read from (None: the
    reward, else the loss) with `mode` ``"max"`` or ``"min"``."""

    name: str
    cluster_id: str | None
    created_at: float
    source: str
    metric: str | None
    mode: str
    run_ids: tuple[str, ...] = ()


class SweepTables:
    """The sweeps of a run store (`tgnb.runs.store.RunStore` gives the connections)."""

    def _connect(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _id(self, run: str) -> str:
        raise NotImplementedError

    def record_sweep(
        self,
        name: str,
        runs: Sequence[str] = (),
        *,
        cluster_id: str | None = None,
        source: str = "",
        metric: str | None = None,
        mode: str | None = None,
    ) -> SweepRecord:
        """Record sweep `name` (created on first use) and add `runs` (ids or names) to it, after
        the runs it holds; `metric`/`mode` given replace the recorded ones."""
        check_sweep_name(name)
        if metric is not None and (not isinstance(metric, str) or not 0 < len(metric) <= 100):
            raise ValidationError(
                f"metric must be a metric's name, got {metric!r:.40}: e.g. 'reward'"
            )
        if mode is not None and mode not in SWEEP_MODES:
            raise ValidationError(f"mode must be 'max' or 'min', got {mode!r:.40}")
        ids = [self._id(r) for r in runs]
        with self._write() as db:
            row = db.execute("SELECT name FROM sweeps WHERE name = ?", (name,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO sweeps (name, cluster_id, created_at, source, metric, mode) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (name, cluster_id, time.time(), source, metric, mode or "max"),
                )
            else:
                if metric is not None:
                    db.execute("UPDATE sweeps SET metric = ? WHERE name = ?", (metric, name))
                if mode is not None:
                    db.execute("UPDATE sweeps SET mode = ? WHERE name = ?", (mode, name))
            (last,) = db.execute(
                "SELECT COALESCE(MAX(position), -1) FROM sweep_runs WHERE sweep = ?", (name,)
            ).fetchone()
            for i, run_id in enumerate(dict.fromkeys(ids), int(last) + 1):
                db.execute(
                    "INSERT OR IGNORE INTO sweep_runs (sweep, run_id, position) VALUES (?, ?, ?)",
                    (name, run_id, i),
                )
        return self.sweep(name)

    def find_sweep(self, name: str) -> SweepRecord | None:
        """Sweep `name`, or None when the store has none."""
        with self._connect() as db:
            row = db.execute(
                "SELECT name, cluster_id, created_at, source, metric, mode FROM sweeps "
                "WHERE name = ?",
                (name,),
            ).fetchone()
            if row is None:
                return None
            ids = db.execute(
                "SELECT run_id FROM sweep_runs WHERE sweep = ? ORDER BY position", (name,)
            ).fetchall()
        name, cluster_id, created, source, metric, mode = row
        return SweepRecord(
            name, cluster_id, created, source, metric, mode, tuple(r[0] for r in ids)
        )

    def sweep(self, name: str) -> SweepRecord:
        """Sweep `name`; `NotFoundError` naming the sweeps there are."""
        found = self.find_sweep(name)
        if found is None:
            known = ", ".join(s.name for s in self.sweeps()[-5:]) or "none yet"
            raise NotFoundError(
                f"no sweep named {name!r} in this run store (sweeps: {known}): list them with "
                "session.sweeps()"
            )
        return found

    def sweeps(self, *, cluster_id: str | None = None) -> builtins.list[SweepRecord]:
        """Every sweep, oldest first; optionally only one cluster's."""
        with self._connect() as db:
            names = db.execute("SELECT name FROM sweeps ORDER BY created_at").fetchall()
        out = [s for (n,) in names if (s := self.find_sweep(n)) is not None]
        return [s for s in out if cluster_id is None or s.cluster_id == cluster_id]


__all__ = ["SWEEP_MODES", "SWEEP_SCHEMA", "SweepRecord", "SweepTables", "check_sweep_name"]
