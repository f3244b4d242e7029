"""A launcher's exit under a real Slurm (`tgnb.runs.outcome`): a protected loop run by a
``command=[torchrun, ...]`` on the one-node cluster of `.ci/slurm-up`, drained mid-run with
``scontrol update ... State=DRAIN``. The worker seals its checkpoint and exits 75, torchrun exits
1; the node's ``python -m tgnb.train`` reads the attempt's record and exits 75, so the sbatch
script requeues the job as a preemption: with ``max_restarts=0`` a failure counted would end it.
And a ``command=`` with no hook that exits 0 on the SIGTERM Slurm sends its step (``scancel
--signal=TERM``): not done, restarted uncounted with "stopped without a checkpoint" said."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.runs.recovery import RecoveryPolicy

from .test_slurm_training import DRAIN_WINDOW_S, ENV, backend_for, metric_steps

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
EXITS = Path(__file__).parents[2] / "session" / "exits_workdir"
LOOP = EXITS / "loop.py"


def submit(
    tmp_path: Path,
    cleanup_jobs: list[str],
    name: str,
    script: Path,
    train: dict[str, Any],
    **more: Any,
) -> tuple[Any, str, Path, RunSpec]:
    """`script` copied into a folder of its own and run there as `train` says, on one CPU node
    with no restart budget (a counted failure would end the run): (backend, job, run dir, spec).
    `more`: more fields of the `RunSpec` (``resources``, ``budget_usd``, ``prices``)."""
    wd = tmp_path / "project"
    wd.mkdir()
    shutil.copy(script, wd / script.name)
    fields: dict[str, Any] = {
        "resources": Resources(nodes=1, gpus_per_node=0, preemptible=True),
        "env": dict(ENV),
        "workdir": str(wd),
        "recovery": RecoveryPolicy(max_restarts=0),
        **more,
    }
    spec = RunSpec(name=name, train={"algorithm": "script", **train}, **fields)
    backend = backend_for(tmp_path)
    job = backend.submit(spec)
    cleanup_jobs.append(job)
    return backend, job, Path(backend.run_dir(job)), spec


def test_torchrun_exiting_1_after_a_sealed_checkpoint_requeues_uncounted(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    command = ["torchrun", "--standalone", "--nproc_per_node=1", "loop.py", "--steps", "150"]
    train = {"command": command, "checkpoint": {"drain_poll_seconds": 0.5}}
    backend, job, run_dir, _ = submit(tmp_path, cleanup_jobs, "torchrun-drain", LOOP, train)
    wait_until(lambda: max(metric_steps(run_dir), default=0) >= 5, 400, what="step 5", every=0.5)
    subprocess.run(
        ["scontrol", "update", f"NodeName={slurm}", "State=DRAIN", "Reason=TogetherPreemption"],
        check=True,
    )
    try:
        wait_until(lambda: backend.restart_count(job) >= 1, DRAIN_WINDOW_S,
                   what="the run to requeue itself", every=0.5)  # fmt: skip
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={slurm}", "State=RESUME"], check=True)
    final = backend.wait(job, timeout=600)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, (final, log[-3000:])
    assert "ChildFailedError" in log  # torchrun itself failed: exit 1
    events = backend.events(job)
    requeued = [e for e in events if e.reason == "RunRequeued"]
    assert [e.data["exit_code"] for e in requeued] == [75], requeued
    assert not [e for e in events if e.reason == "RunFailedRestarting"]
    assert sorted(set(metric_steps(run_dir))) == list(range(1, 151))


def test_a_command_exiting_0_on_sigterm_with_nothing_sealed_is_restarted_uncounted(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Before, the node's ``python -m tgnb.train`` passed the command's 0 on: the job COMPLETED
    at the step it was stopped at, a success."""
    backend, job, run_dir, _ = submit(tmp_path, cleanup_jobs, "command-quits", EXITS / "quits.py",
                                   {"command": ["python", "quits.py", "60"]})  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    rows = lambda: len(metrics.read_text().splitlines()) if metrics.exists() else 0  # noqa: E731
    wait_until(lambda: rows() >= 5, 400, what="step 5", every=0.5)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)  # the step, not the script
    final = backend.wait(job, timeout=600)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, (final, log[-3000:])
    events = backend.events(job)
    (unsaved,) = [e for e in events if e.reason == "RunExited"]
    lost = unsaved.data["steps_lost"]
    assert unsaved.data["exit_reason"] == "unsaved" and lost >= 5, unsaved
    assert unsaved.message == f"stopped without a checkpoint at step {lost}: {lost} steps lost"
    requeued = [e for e in events if e.reason == "RunRequeued"]
    assert [e.data["exit_code"] for e in requeued] == [75], requeued
    assert not [e for e in events if e.reason == "RunFailedRestarting"]
    assert rows() == 60 + lost  # the second attempt ran all 60 steps


@pytest.mark.parametrize("how", ["script", "command"])
def test_a_failure_every_start_would_repeat_is_not_requeued(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], how: str
) -> None:
    """A lazy import of a module that is not installed: the node exits 78 (`Exit.REPEATS`), which
    the sbatch script holds final (`FINAL_CODES`), with three restarts left; the line is in the
    log. It failed the same way four times before; as a ``command=`` too (its stderr read)."""
    script = tmp_path / "lazy.py"
    script.write_text("def load():\n    import tgnb_no_such_module  # noqa\n\n\nload()\n")
    policy = RecoveryPolicy(max_restarts=3, backoff_s=1.0)
    train: dict[str, Any] = {"script": "lazy.py"}
    if how == "command":
        train = {"command": ["python", "lazy.py"]}
    backend, job, _, _ = submit(tmp_path, cleanup_jobs, f"repeats-{how}", script, train,
                                recovery=policy)  # fmt: skip
    final = backend.wait(job, timeout=300)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.FAILED and final.exit_code == 78, (final, log[-3000:])
    assert final.restart_count == 0, final
    assert "No module named 'tgnb_no_such_module': it fails the same way at every start" in log
    assert not [e for e in backend.events(job) if e.reason == "RunFailedRestarting"]
