"""A user's own script under a real Slurm: the SFTTrainer script of tests/session/user_workdir
(TRL's quickstart plus ``tgnb.train.protect``), submitted by `SlurmBackend` with its workdir to the
one-node cluster of `.ci/slurm-up`, drained mid-run with ``scontrol update ... State=DRAIN``. The
run must checkpoint on the drain notice, requeue itself, and resume from the workdir's snapshot
(the folder is edited after submission: the requeued job must not see the edit)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.tasks import assets

from .test_slurm_training import DRAIN_WINDOW_S, ENV, backend_for, metric_steps

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("trl")
USER_WORKDIR = Path(__file__).parents[2] / "session" / "user_workdir"


def _submit(
    tmp_path: Path, cleanup_jobs: list[str], name: str, wd: Path, args: list[str]
) -> tuple[Any, str]:
    """Submit ``train.py`` of `wd` with `args` as a one-node preemptible script run."""
    spec = RunSpec(
        name=name,
        train={
            "algorithm": "script",
            "script": "train.py",
            "args": args,
            "checkpoint": {"drain_poll_seconds": 0.5},
        },
        resources=Resources(nodes=1, gpus_per_node=0, preemptible=True),
        env=dict(ENV),
        workdir=str(wd),
    )
    backend = backend_for(tmp_path)
    job = backend.submit(spec)
    cleanup_jobs.append(job)
    return backend, job


def _drained_once(slurm: str, backend: Any, job: str, run_dir: Path) -> str:
    """Drain the node once the run has logged step 3, wait for the run to requeue itself and
    succeed after one restart; its log."""
    wait_until(lambda: max(metric_steps(run_dir), default=0) >= 3, 400, what="step 3", every=0.5)
    subprocess.run(
        ["scontrol", "update", f"NodeName={slurm}", "State=DRAIN", "Reason=TogetherPreemption"],
        check=True,
    )
    try:
        wait_until(lambda: backend.restart_count(job) >= 1, DRAIN_WINDOW_S, what="the run to requeue itself", every=0.5)  # fmt: skip
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={slurm}", "State=RESUME"], check=True)
    final = backend.wait(job, timeout=600)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, (final, log[-3000:])
    return log


def test_a_script_run_drained_requeues_and_resumes_from_its_snapshot(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    wd = tmp_path / "project"
    shutil.copytree(USER_WORKDIR, wd, ignore=shutil.ignore_patterns("__pycache__"))
    with open(wd / "data.jsonl", "w", encoding="utf-8") as fh:
        for i in range(200):
            fh.write(json.dumps({"a": i % 3, "b": (i // 3) % 3}) + "\n")
    max_steps = 160  # a fast machine ran all of 16 between step 3 and the drain notice
    args = ["--model", assets.resolve_model("tiny"), "--max-steps", str(max_steps)]
    backend, job = _submit(tmp_path, cleanup_jobs, "script-drain", wd, args)
    (wd / "prompts.py").write_text("raise ImportError('edited after submission')\n")
    run_dir = Path(backend.run_dir(job))
    assert (run_dir / "workdir" / "train.py").is_file()
    log = _drained_once(slurm, backend, job, run_dir)
    assert "user script: done" in log
    events = backend.events(job)
    drain = next(e for e in events if e.reason == "DrainNoticeReceived")
    resumed = next(e for e in events if e.reason == "RunResumed")
    assert resumed.data["step"] == drain.data["step"]
    steps = metric_steps(run_dir)
    assert sorted(set(steps)) == list(range(1, max_steps + 1)), steps
    assert len(steps) == len(set(steps)), steps  # every step logged once


LIGHTNING_WORKDIR = Path(__file__).parents[2] / "session" / "lightning_workdir"


def test_a_lightning_script_drained_requeues_and_loses_no_step(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Lightning's docs' shape plus ``tgnb.train.protect(trainer)`` (tests/session/
    lightning_workdir), drained on real Slurm: checkpoint on the notice, requeue, resume."""
    wd = tmp_path / "lit-project"
    shutil.copytree(LIGHTNING_WORKDIR, wd, ignore=shutil.ignore_patterns("__pycache__"))
    max_steps = 2000
    backend, job = _submit(
        tmp_path, cleanup_jobs, "lightning-drain", wd, ["--max-steps", str(max_steps)]
    )
    run_dir = Path(backend.run_dir(job))
    log = _drained_once(slurm, backend, job, run_dir)
    assert "lightning script: done" in log
    resumed = next(e for e in backend.events(job) if e.reason == "RunResumed")
    assert resumed.data["step"] >= 3
    steps = metric_steps(run_dir)
    assert sorted(steps) == list(range(1, max_steps + 1)), steps  # every step logged once
