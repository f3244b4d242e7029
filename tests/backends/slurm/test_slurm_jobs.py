"""The Slurm backend against a real slurmctld/slurmd (started by `.ci/slurm-up`).

The training runtime is replaced here by ``fake_train.sh`` (a few lines of bash that write the
runtime's start/exit events and sleep), so these tests exercise only the Slurm plumbing: the
rendered script, sbatch, scontrol, requeue, logs and events. test_slurm_training.py runs the real
runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, JobStatus, Resources, RunSpec, SecretRef
from tgnb.backends.slurm import SlurmBackend

from .conftest import fake_train

FAKE_TRAIN = str(Path(__file__).with_name("fake_train.sh"))
TOKEN = "tok-not-in-any-file-8731"
pytestmark = pytest.mark.slurm


def wait_for(
    backend: SlurmBackend, job: str, ok: Callable[[JobStatus], bool], timeout: float
) -> JobStatus:
    """The job's status once `ok` holds for it."""
    last: list[JobStatus] = []

    def reached() -> JobStatus | None:
        last[:] = [backend.status(job)]
        return last[0] if ok(last[0]) else None

    try:
        return wait_until(
            reached, timeout, what=f"job {job} to reach the expected state", every=0.5
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last {last[-1] if last else None}") from None


def make_backend(tmp_path: Path) -> SlurmBackend:
    return SlurmBackend(
        runs_root=tmp_path / "runs", gres=False, python=FAKE_TRAIN, poll_seconds=0.5
    )


def spec(name: str, **knobs: int) -> RunSpec:
    return RunSpec(
        name=name,
        train={},
        resources=Resources(nodes=1, gpus_per_node=0, preemptible=True),
        env={"TGNB_TEST": "1", **fake_train(**knobs)},
        secrets={"TGNB_TEST_TOKEN": SecretRef(name="token", env="TGNB_TEST_TOKEN_SRC")},
    )


def test_submit_follow_to_completion(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TGNB_TEST_TOKEN_SRC", TOKEN)
    backend = make_backend(tmp_path)
    job = backend.submit(spec("plumbing", sleep=1))
    cleanup_jobs.append(job)
    lines = list(backend.logs(job, follow=True))
    st = backend.status(job)
    assert st.state is JobState.SUCCEEDED, (st, lines)
    assert st.exit_code == 0 and st.restart_count == 0
    assert st.nodes == (slurm,)
    assert f"fake-train restart=0 node={slurm} token_set=yes" in lines
    assert "fake-train: done" in lines
    run_dir = Path(backend.run_dir(job))
    assert run_dir == tmp_path / "runs" / "plumbing"
    for f in ("job.sbatch", "run.json", "config.yaml", f"slurm-{job}.out"):
        assert TOKEN not in (run_dir / f).read_text()
    assert [e.reason for e in backend.events(job)] == ["RunStarted", "RunExited"]


def test_requeue_restarts_with_count_one(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TGNB_TEST_TOKEN_SRC", TOKEN)
    backend = make_backend(tmp_path)
    job = backend.submit(spec("requeue", sleep=6))
    cleanup_jobs.append(job)
    log = Path(backend.run_dir(job)) / f"slurm-{job}.out"
    started = lambda: "fake-train restart=0" in (log.read_text() if log.exists() else "")  # noqa: E731
    wait_until(started, 60, what="the job's step to start", every=0.3)
    backend.requeue(job)
    st = wait_for(backend, job, lambda s: s.restart_count >= 1, 30)
    assert st.state in (JobState.REQUEUED, JobState.RUNNING), st
    assert backend.restart_count(job) == 1
    final = backend.wait(job, timeout=120)
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, final
    log = "\n".join(backend.logs(job))
    assert "fake-train restart=0" in log and "fake-train restart=1" in log
    assert f"tgnb: job {job} requeued (restart 1)" in log
    restarts = [e.data["restart"] for e in backend.events(job) if e.reason == "RunStarted"]
    assert restarts == [0, 1]


def test_exit_75_requeues_itself(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that checkpointed after a drain notice exits 75: the script requeues its own job."""
    monkeypatch.setenv("TGNB_TEST_TOKEN_SRC", TOKEN)
    backend = make_backend(tmp_path)
    job = backend.submit(spec("self-requeue", sleep=1, first_exit=75))
    cleanup_jobs.append(job)
    final = backend.wait(job, timeout=120)
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, final
    log = "\n".join(backend.logs(job))
    assert f"requeueing job {job}" in log
    # the script's own event, in the runtime's format (the script, not the runtime, requeues)
    requeued = [e for e in backend.events(job) if e.reason == "RunRequeued"]
    assert [(e.data["job_id"], e.data["exit_code"]) for e in requeued] == [(job, 75)], requeued


def test_cancel(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TGNB_TEST_TOKEN_SRC", TOKEN)
    backend = make_backend(tmp_path)
    job = backend.submit(spec("cancel", sleep=60))
    cleanup_jobs.append(job)
    wait_for(backend, job, lambda s: s.state is JobState.RUNNING, 60)
    # Cancel once the program runs: Slurm reports RUNNING from the allocation on, and a step
    # killed while slurmstepd is still launching it stays COMPLETING for over a minute (seen in
    # CI: "Abandoning IO 60 secs after job shutdown initiated"; Slurm's own race, not ours).
    started = lambda: any(e.reason == "RunStarted" for e in backend.events(job))  # noqa: E731
    wait_until(started, 60, what="the job's program to start", every=0.2)
    backend.cancel(job)
    st = wait_for(backend, job, lambda s: s.state.finished, 60)
    assert st.state is JobState.CANCELLED


def test_missing_secret_is_refused_before_submitting(
    slurm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.errors import ValidationError

    monkeypatch.delenv("TGNB_TEST_TOKEN_SRC", raising=False)
    backend = make_backend(tmp_path)
    with pytest.raises(ValidationError, match="TGNB_TEST_TOKEN_SRC"):
        backend.submit(spec("nosecret", sleep=1))
    assert not (tmp_path / "runs" / "nosecret").exists()
    assert os.environ.get("TGNB_TEST_TOKEN_SRC") is None


def test_submit_through_a_login_node_over_ssh(
    slurm: str,
    tmp_path: Path,
    cleanup_jobs: list[str],
    monkeypatch: pytest.MonkeyPatch,
    login_node: tuple[str, tuple[str, ...]],
) -> None:
    """The whole path over a real sshd on loopback: files written, sbatch, scontrol, logs and
    events read back over SSH; the secret travels by SendEnv, never in an argv or a file."""
    from tgnb.backends.slurm import CommandRunner

    host, options = login_node
    monkeypatch.setenv("TGNB_TEST_TOKEN_SRC", TOKEN)
    runner = CommandRunner(host, ssh_options=options)
    backend = SlurmBackend(
        runner=runner,
        runs_root=tmp_path / "remote",
        gres=False,
        python=FAKE_TRAIN,
        poll_seconds=0.5,
    )
    job = backend.submit(spec("over-ssh", sleep=1))
    cleanup_jobs.append(job)
    lines = list(backend.logs(job, follow=True))
    st = backend.status(job)
    assert st.state is JobState.SUCCEEDED, (st, lines)
    assert f"fake-train restart=0 node={slurm} token_set=yes" in lines
    assert [e.reason for e in backend.events(job)] == ["RunStarted", "RunExited"]
    run_dir = tmp_path / "remote" / "over-ssh"
    assert backend.run_dir(job) == str(run_dir)
    assert TOKEN not in (run_dir / "job.sbatch").read_text()


def test_a_job_the_controller_forgot(slurm: str, tmp_path: Path) -> None:
    """Without accounting, a purged job's end comes from its run's events.jsonl."""
    from tgnb.backends.slurm.backend import FORGOTTEN
    from tgnb.events import Event, utcnow

    backend = make_backend(tmp_path)
    gone = "987654321"
    st = backend.status(gone)
    assert st.state is JobState.UNKNOWN and st.detail == FORGOTTEN
    run_dir = tmp_path / "old-run"
    run_dir.mkdir()
    ev = Event(utcnow(), "run", "RunExited", "finished at step 3", data={"exit_code": 0})
    (run_dir / "events.jsonl").write_text(ev.to_json() + "\n")
    backend.attach(gone, run_dir)
    st = backend.status(gone)
    assert st.state is JobState.SUCCEEDED and st.exit_code == 0
    assert backend.wait(gone, timeout=5).state is JobState.SUCCEEDED
