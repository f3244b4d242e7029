"""The local backend: runs on the emulated nodes of a cluster served by the local emulator.

Each run gets a detached supervisor process (`tgnb.backends.local.supervisor`) that places it on
emulated nodes and plays the platform's part when a node is preempted. The supervisor outlives the
kernel that launched it and writes everything to the run store, so the backend itself holds no
state: any process that opens the same tgnb home sees the same runs. The job id is the run id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tgnb.backends.base import JobState, JobStatus, RunSpec
from tgnb.backends.local import proctree
from tgnb.config import Secret
from tgnb.errors import BackendError
from tgnb.events import Event, read_jsonl
from tgnb.runs import logtail, node
from tgnb.runs.store import RunRecord, RunStore

SUPERVISOR_LOG = "supervisor.log"
_SUPERVISOR_MODULE = "tgnb.backends.local.supervisor"
#: Supervisors this process started; polled so that none stays a zombie while the kernel lives.
_STARTED: list[subprocess.Popen[bytes]] = []


def emulator_endpoint(home: str | Path) -> tuple[str, str | None] | None:
    """The (base_url, api_key) of the emulator daemon running for tgnb home `home`, or None."""
    from tgnb.emulator import daemon

    st = daemon.status(Path(home), timeout=2.0)
    if not st.running or st.base_url is None:
        return None
    return st.base_url, (st.api_key.get() if st.api_key else None)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _handles_sigterm(pid: int) -> bool:
    """Whether process `pid` has installed its SIGTERM handler (``SigCgt`` in /proc; True where
    that cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError, IndexError):
        return True
    return True


def _reap() -> None:
    for proc in list(_STARTED):
        if proc.poll() is not None:
            _STARTED.remove(proc)


def supervisor_alive(pid: int | None) -> bool:
    """Whether `pid` is a live (not zombie) tgnb supervisor process."""
    _reap()
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}")
    if proc.exists():
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return False
            return _SUPERVISOR_MODULE.encode() in (proc / "cmdline").read_bytes()
        except OSError:
            return False
    return True


class LocalBackend:
    """Runs on one emulated cluster: `cluster_id` of type KUBERNETES or SLURM."""

    name = "local"

    def __init__(
        self,
        store: RunStore,
        *,
        cluster_id: str,
        cluster_type: str,
        base_url: str,
        api_key: Secret | str | None,
        poll: float = 0.2,
    ) -> None:
        self.store = store
        self.home = store.home
        self.cluster_id = cluster_id
        self.cluster_type = cluster_type.upper()
        self.base_url = base_url
        self._key = api_key if isinstance(api_key, Secret) or api_key is None else Secret(api_key)
        self.poll = poll

    def __repr__(self) -> str:
        return f"<LocalBackend cluster={self.cluster_id} type={self.cluster_type}>"

    def preflight(self, spec: RunSpec) -> None:
        """Nothing more to check: the spec checked itself and its snapshot when they were made,
        and the emulated nodes run on this machine."""

    def run_dir_for(self, name: str) -> Path:
        """Where a run keeps its checkpoints, metrics and events by default."""
        return self.home / "runs" / name

    # -- Backend protocol ----------------------------------------------------------------------

    def submit(self, spec: RunSpec, prepared: None = None) -> str:
        """Start the supervisor of the run the session recorded under `spec.name`; the job id is
        the run's id (the supervisor's records in the run store are this engine's state)."""
        rec = self.store.find(spec.name)
        if rec is None:
            raise BackendError(
                f"no run {spec.name!r} in the run store: launch runs with session.launch(...), "
                "which records the run before the backend starts it"
            )
        run_dir = Path(rec.run_dir or self.run_dir_for(spec.name))
        run_dir.mkdir(parents=True, exist_ok=True)
        snapshot = spec.workdir_snapshot()
        if snapshot is not None:  # once: every start of the run uses this snapshot
            snapshot.copy_into(run_dir / node.WORKDIR)
        self._start_supervisor(rec, run_dir)
        return rec.id

    def _start_supervisor(self, rec: RunRecord, run_dir: Path) -> int:
        env = dict(os.environ)
        env.pop(proctree.TAG_ENV, None)  # a kernel inside a run's process: the supervisor is not
        env["TOGETHER_BASE_URL"] = self.base_url
        if self._key:
            env["TOGETHER_API_KEY"] = self._key.get()
        env["TGNB_HOME"] = str(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_HUB_OFFLINE"] = "1"  # emulated nodes have no Hub: the run's own env may say else
        cmd = [
            sys.executable,
            "-m",
            _SUPERVISOR_MODULE,
            "--home",
            str(self.home),
            "--run",
            rec.id,
            "--cluster",
            self.cluster_id,
            "--type",
            self.cluster_type,
            "--poll",
            str(self.poll),
        ]
        with open(run_dir / SUPERVISOR_LOG, "ab") as log:
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=run_dir,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise BackendError(f"could not start the run's supervisor: {exc}") from None
        _STARTED.append(proc)
        self.store.add_job(rec.id, rec.id, pid=proc.pid)  # the engine's note: its supervisor
        return proc.pid

    def _supervisor_pid(self, rec: RunRecord) -> int | None:
        for job in reversed(rec.jobs):
            pid = job.info.get("pid")
            if pid:
                return int(pid)
        return None

    def status(self, job_id: str) -> JobStatus:
        rec = self.store.get(job_id)
        state, detail = rec.state, rec.detail
        if not state.finished and not supervisor_alive(self._supervisor_pid(rec)):
            state = JobState.UNKNOWN
            detail = "its supervisor is gone (machine restarted?): session.recover() restarts it"
        return JobStatus(state, rec.restart_count, rec.nodes, rec.exit_code, detail)

    def cancel(self, job_id: str) -> None:
        """SIGTERM to the supervisor: it stops the processes (they checkpoint) and records it."""
        rec = self.store.get(job_id)
        if rec.state.finished:
            return
        pid = self._supervisor_pid(rec)
        # a supervisor just started may not handle SIGTERM yet (it would die of it, recording
        # nothing): wait the moment it takes to get there
        deadline = time.monotonic() + 15.0
        while supervisor_alive(pid) and not _handles_sigterm(pid or 0):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if supervisor_alive(pid):
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            return
        children = [int(c) for job in rec.jobs for c in job.info.get("children") or ()]
        proctree.kill_run(rec.id, children)
        self.store.set_state(rec.id, JobState.CANCELLED, "stopped (no supervisor was running)")

    def recover(self, job_id: str) -> bool:
        """Start a new supervisor for a run whose supervisor is gone; False if none was needed.

        The run resumes from its newest complete checkpoint on a schedulable node.
        """
        rec = self.store.get(job_id)
        if rec.state.finished or supervisor_alive(self._supervisor_pid(rec)):
            return False
        self._end_orphans(rec)
        run_dir = Path(rec.run_dir or self.run_dir_for(rec.name))
        self._start_supervisor(rec, run_dir)
        return True

    def _end_orphans(self, rec: RunRecord, grace: float = 30.0) -> None:
        """Stop training processes a dead supervisor left behind: SIGTERM (they checkpoint and
        exit), then SIGKILL after `grace` seconds, to the run's whole process tree
        (`tgnb.backends.local.proctree`), so two never train the same run at once."""
        groups = [int(c) for job in rec.jobs for c in job.info.get("children") or ()]
        live = [g for g in groups if _group_alive(g)]
        proctree.signal_run(rec.id, live, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (live or proctree.members(rec.id)) and time.monotonic() < deadline:
            time.sleep(0.1)
            live = [g for g in live if _group_alive(g)]
        proctree.kill_run(rec.id, live)

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """The raw lines of the run's ``train.log`` (the caller's `Run` parses the ``@tgnb``
        records or leaves them out); with `follow`, until the run has finished."""
        rec = self.store.get(job_id)
        path = Path(rec.run_dir or self.run_dir_for(rec.name)) / node.LOG
        if not follow:
            yield from logtail.read_lines(path)
            return
        yield from logtail.tail(path, lambda: self.store.get(job_id).state.finished, self.poll)

    def events(self, job_id: str) -> list[Event]:
        rec = self.store.get(job_id)
        if not rec.run_dir:
            return []
        return list(read_jsonl(Path(rec.run_dir) / "events.jsonl", run=rec.name))

    def restart_count(self, job_id: str) -> int:
        return self.store.get(job_id).restart_count
