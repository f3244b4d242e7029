"""The durable run store: one sqlite file (WAL) under the tgnb home.

It holds, per run: id, name (unique), cluster id, backend, the `RunSpec` as JSON (`RunSpec.to_dict`,
with its schema version), the engine's job ids, the status history (time, state, detail, node) and the run directory. A notebook kernel, the
local backend's detached supervisors and a later kernel all open the same file, so runs outlive a
kernel restart: a new `tgnb.Session` lists them and reattaches.

Every call opens its own short-lived connection, so one `RunStore` may be shared between threads
and processes; sqlite's WAL mode and a busy timeout serialise the writers.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.errors import NotFoundError, ValidationError
from tgnb.runs.spec import JobState, RunSpec
from tgnb.runs.sweepstore import SWEEP_SCHEMA, SweepTables

STORE_FILE = "runs.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  cluster_id TEXT,
  backend TEXT NOT NULL,
  spec TEXT NOT NULL,
  run_dir TEXT,
  created_at REAL NOT NULL,
  state TEXT NOT NULL,
  detail TEXT NOT NULL DEFAULT '',
  restart_count INTEGER NOT NULL DEFAULT 0,
  nodes TEXT NOT NULL DEFAULT '[]',
  exit_code INTEGER
);
CREATE TABLE IF NOT EXISTS jobs (
  run_id TEXT NOT NULL REFERENCES runs(id),
  job_id TEXT NOT NULL,
  created_at REAL NOT NULL,
  info TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (run_id, job_id)
);
CREATE TABLE IF NOT EXISTS history (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL REFERENCES runs(id),
  time REAL NOT NULL,
  state TEXT NOT NULL,
  detail TEXT NOT NULL DEFAULT '',
  node TEXT
);
CREATE INDEX IF NOT EXISTS history_run ON history(run_id, seq);
"""


@dataclass(frozen=True)
class StatusChange:
    """One line of a run's status history."""

    time: float
    state: JobState
    detail: str = ""
    node: str | None = None


@dataclass(frozen=True)
class JobRecord:
    """One engine job of a run (a Slurm job id, a Kubernetes Job name, a local supervisor)."""

    job_id: str
    created_at: float
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """What the store knows about one run."""

    id: str
    name: str
    cluster_id: str | None
    backend: str
    spec: RunSpec
    run_dir: str | None
    created_at: float
    state: JobState
    detail: str = ""
    restart_count: int = 0
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    jobs: tuple[JobRecord, ...] = ()

    @property
    def job_id(self) -> str | None:
        """The newest engine job of the run."""
        return self.jobs[-1].job_id if self.jobs else None


class RunStore(SweepTables):
    """The run store under `home` (``<home>/runs.sqlite``)."""

    def __init__(self, home: str | Path) -> None:
        self.home = Path(home).expanduser()
        self.home.mkdir(parents=True, exist_ok=True)
        self.path = self.home / STORE_FILE
        # the owner's only (a spec's env is in it): created 0600, and an older one tightened; SQLite
        # gives its -wal and -shm files the database file's mode
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        for path in (
            self.path,
            *(self.path.with_name(self.path.name + x) for x in ("-wal", "-shm")),
        ):
            with contextlib.suppress(OSError):
                if path.stat().st_mode & 0o077:
                    path.chmod(0o600)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA + SWEEP_SCHEMA)

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r})"

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("PRAGMA synchronous=NORMAL")
            yield db
        finally:
            db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # -- writing -------------------------------------------------------------------------------

    def create(
        self,
        spec: RunSpec,
        *,
        backend: str,
        cluster_id: str | None = None,
        run_dir: str | Path | None = None,
        detail: str = "submitted",
    ) -> RunRecord:
        """Record a new run in state ``pending``. Its name must not be taken (the spec is valid:
        `RunSpec` checks itself when it is built)."""
        run_id = "run-" + uuid.uuid4().hex[:12]
        now = time.time()
        with self._write() as db:
            taken = db.execute("SELECT id FROM runs WHERE name = ?", (spec.name,)).fetchone()
            if taken:
                raise ValidationError(
                    f"a run named {spec.name!r} already exists: choose another name= "
                    "(or reattach with session.run(name))"
                )
            db.execute(
                "INSERT INTO runs (id, name, cluster_id, backend, spec, run_dir, created_at, state,"
                " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    spec.name,
                    cluster_id,
                    backend,
                    json.dumps(spec.to_dict(), sort_keys=True),
                    None if run_dir is None else str(run_dir),
                    now,
                    JobState.PENDING.value,
                    detail,
                ),
            )
            db.execute(
                "INSERT INTO history (run_id, time, state, detail) VALUES (?, ?, ?, ?)",
                (run_id, now, JobState.PENDING.value, detail),
            )
        return self.get(run_id)

    def add_job(self, run: str, job_id: str, **info: Any) -> None:
        """Record an engine job id of a run (several after requeues on some engines), or add to
        what is noted of a recorded one: `info` is merged into the job's (the session records the
        job once; the local engine notes its supervisor's pid and children on the same job)."""
        run_id = self._id(run)
        with self._write() as db:
            row = db.execute(
                "SELECT created_at, info FROM jobs WHERE run_id = ? AND job_id = ?",
                (run_id, job_id),
            ).fetchone()
            created, noted = (row[0], json.loads(row[1])) if row else (time.time(), {})
            db.execute(
                "INSERT OR REPLACE INTO jobs (run_id, job_id, created_at, info) VALUES (?, ?, ?, ?)",
                (run_id, job_id, created, json.dumps({**noted, **info}, sort_keys=True)),
            )

    def set_state(
        self,
        run: str,
        state: JobState,
        detail: str = "",
        *,
        node: str | None = None,
        nodes: Sequence[str] | None = None,
        restart_count: int | None = None,
        exit_code: int | None = None,
        at: float | None = None,
        expect: tuple[JobState, int] | None = None,
    ) -> None:
        """Change a run's state and append the change to its history.

        A run that has finished (succeeded, failed, cancelled) keeps its final state: later
        changes are ignored, so a late writer cannot resurrect it. With `expect` (the state and
        restart count the writer read) the change is made only if the run is still there, so a
        writer that follows the engine (`Run.sync`) never undoes a newer change.
        """
        run_id = self._id(run)
        now = time.time() if at is None else at
        with self._write() as db:
            row = db.execute(
                "SELECT state, restart_count FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
            if row is None or JobState(row[0]).finished:
                return
            if expect is not None and (JobState(row[0]), int(row[1])) != expect:
                return
            sets = ["state = ?", "detail = ?"]
            args: list[Any] = [state.value, detail]
            if nodes is not None:
                sets.append("nodes = ?")
                args.append(json.dumps(list(nodes)))
            if restart_count is not None:
                sets.append("restart_count = ?")
                args.append(restart_count)
            if exit_code is not None:
                sets.append("exit_code = ?")
                args.append(exit_code)
            db.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?", (*args, run_id))
            db.execute(
                "INSERT INTO history (run_id, time, state, detail, node) VALUES (?, ?, ?, ?, ?)",
                (run_id, now, state.value, detail, node),
            )

    def claim(
        self,
        run: str,
        candidates: Sequence[tuple[str, int]],
        *,
        want: int,
        least: int,
        gpus_per_node: int,
        restart_count: int,
    ) -> list[str]:
        """Place a run atomically: pick up to `want` (at least `least`) of the `candidates`
        (node name, GPUs) whose GPUs not held by other running (or unknown) runs of the cluster fit
        `gpus_per_node`, and mark the run running there. Returns the nodes, or [] if too few fit.

        One write transaction decides and records, so two supervisors never take the same GPUs.
        """
        run_id = self._id(run)
        now = time.time()
        with self._write() as db:
            row = db.execute(
                "SELECT cluster_id, state FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
            if row is None or JobState(row[1]).finished:
                return []
            used: dict[str, int] = {}
            # an UNKNOWN run (its supervisor gone) may still have processes on its nodes
            others = db.execute(
                "SELECT nodes, spec FROM runs WHERE cluster_id IS ? AND state IN (?, ?) AND id != ?",
                (row[0], JobState.RUNNING.value, JobState.UNKNOWN.value, run_id),
            ).fetchall()
            for nodes, spec in others:
                need = int(json.loads(spec).get("resources", {}).get("gpus_per_node", 8))
                for node in json.loads(nodes):
                    used[node] = used.get(node, 0) + need
            free = [n for n, gpus in candidates if gpus - used.get(n, 0) >= gpus_per_node]
            free.sort(key=lambda n: used.get(n, 0))  # stable: keeps the candidates' order
            if len(free) < least:
                return []
            chosen = free[:want]
            detail = f"running on {', '.join(chosen)}"
            db.execute(
                "UPDATE runs SET state = ?, detail = ?, nodes = ?, restart_count = ? WHERE id = ?",
                (JobState.RUNNING.value, detail, json.dumps(chosen), restart_count, run_id),
            )
            db.execute(
                "INSERT INTO history (run_id, time, state, detail, node) VALUES (?, ?, ?, ?, ?)",
                (run_id, now, JobState.RUNNING.value, detail, chosen[0]),
            )
        return chosen

    def delete(self, run: str) -> None:
        """Forget a run (its run directory is left alone)."""
        run_id = self._id(run)
        with self._write() as db:
            db.execute("DELETE FROM history WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM jobs WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM sweep_runs WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    # -- reading -------------------------------------------------------------------------------

    def _id(self, run: str) -> str:
        with self._connect() as db:
            row = db.execute("SELECT id FROM runs WHERE id = ? OR name = ?", (run, run)).fetchone()
        if row is None:
            raise NotFoundError(
                f"no run named {run!r} in this run store: list runs with session.runs()"
            )
        return str(row[0])

    def get(self, run: str) -> RunRecord:
        """A run by id or name; `NotFoundError` if the store has none."""
        run_id = self._id(run)
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            jobs = db.execute(
                "SELECT job_id, created_at, info FROM jobs WHERE run_id = ? ORDER BY created_at",
                (run_id,),
            ).fetchall()
        return _record(row, jobs)

    def find(self, run: str) -> RunRecord | None:
        try:
            return self.get(run)
        except NotFoundError:
            return None

    def list(self, *, cluster_id: str | None = None, active: bool | None = None) -> list[RunRecord]:
        """Runs, oldest first; optionally only one cluster's, or only those not finished."""
        with self._connect() as db:
            rows = db.execute("SELECT id FROM runs ORDER BY created_at").fetchall()
        out = [self.get(r[0]) for r in rows]
        if cluster_id is not None:
            out = [r for r in out if r.cluster_id == cluster_id]
        if active is not None:
            out = [r for r in out if (not r.state.finished) == active]
        return out

    def history(self, run: str) -> builtins.list[StatusChange]:
        """A run's status changes, oldest first."""
        run_id = self._id(run)
        with self._connect() as db:
            rows = db.execute(
                "SELECT time, state, detail, node FROM history WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
        return [StatusChange(r[0], JobState(r[1]), r[2], r[3]) for r in rows]


def _record(row: Sequence[Any], jobs: Sequence[Sequence[Any]]) -> RunRecord:
    (run_id, name, cluster_id, backend, spec, run_dir, created, state, detail, rc, nodes, code) = (
        row
    )
    return RunRecord(
        id=run_id,
        name=name,
        cluster_id=cluster_id,
        backend=backend,
        spec=RunSpec.from_dict(json.loads(spec)),
        run_dir=run_dir,
        created_at=created,
        state=JobState(state),
        detail=detail,
        restart_count=rc,
        nodes=tuple(json.loads(nodes)),
        exit_code=code,
        jobs=tuple(JobRecord(j[0], j[1], json.loads(j[2])) for j in jobs),
    )
