"""Real training under a real Slurm: ``python -m tgnb.train`` (TRL GRPO on the built-in ``tiny``
model and ``arithmetic`` data, on the CPU) submitted by `SlurmBackend` to the one-node cluster of
`.ci/slurm-up`. Nothing is faked: the preemption is Slurm's own (a job in the ``high`` partition
requeues the run in ``low``) and the drain is ``scontrol update NodeName=... State=DRAIN``.

The drain window Together gives a node (five minutes) is shortened to `DRAIN_WINDOW_S`: the run must
have checkpointed and requeued itself before it ends.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm import SlurmBackend
from tgnb.runs.recovery import RecoveryPolicy

from .conftest import set_features

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("trl")

DRAIN_WINDOW_S = 120.0  # Together's 300 s drain window, shortened
# The preemption and the drain come at step >= 6 of 36, and those runs are paced (>= 0.15 s a step):
# the 30 steps left give the run seconds to see the notice before it would finish anyway.
ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}


def grpo_spec(
    name: str, max_steps: int, paced: bool = False, recovery: RecoveryPolicy | None = None
) -> RunSpec:
    """A tiny GRPO run; `paced` swaps the format reward for `paced_reward.paced` (same reward,
    after a short sleep) so that the steps after a notice take seconds, not a blink."""
    train: dict[str, Any] = {
        "algorithm": "grpo",
        "model": "tiny",
        "dataset": "arithmetic",
        "max_steps": max_steps,
        "seed": 0,
        "checkpoint": {"every_steps": 5, "keep_last": 3, "drain_poll_seconds": 0.5},
    }
    env = dict(ENV)
    if paced:
        train["rewards"] = ["correctness", "paced_reward:paced"]
        env["PYTHONPATH"] = str(Path(__file__).parent)
    return RunSpec(
        name=name,
        train=train,
        resources=Resources(nodes=1, gpus_per_node=0, preemptible=True),
        env=env,
        recovery=recovery,
    )


def metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in record and "loss" in record:
            steps.append(int(record["step"]))
    return steps


def backend_for(tmp_path: Path) -> SlurmBackend:
    return SlurmBackend(runs_root=tmp_path / "runs", gres=False, poll_seconds=1.0)


def reasons(backend: SlurmBackend, job: str) -> list[str]:
    return [e.reason for e in backend.events(job)]


def assert_steps_continue(run_dir: Path, resumed_at: int, max_steps: int) -> None:
    """Steps after the resume start right after the checkpoint, and every step up to max_steps ran."""
    steps = metric_steps(run_dir)
    first_run = steps[: steps.index(resumed_at + 1, 1)] if resumed_at + 1 in steps[1:] else steps
    second_run = steps[len(first_run) :]
    assert second_run and second_run[0] == resumed_at + 1, (resumed_at, steps)
    assert second_run[-1] == max_steps, steps
    assert sorted(set(steps)) == list(range(1, max_steps + 1)), steps


def test_tiny_grpo_run_completes(slurm: str, tmp_path: Path, cleanup_jobs: list[str]) -> None:
    backend = backend_for(tmp_path)
    job = backend.submit(grpo_spec("grpo-complete", max_steps=6))
    cleanup_jobs.append(job)
    final = backend.wait(job, timeout=400)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED, (final, log[-2000:])
    assert final.exit_code == 0 and final.restart_count == 0
    run_dir = Path(backend.run_dir(job))
    assert metric_steps(run_dir) == list(range(1, 7))
    every = backend.events(job)
    # the node's own meter brackets the program's records (tgnb.runs.meter)
    assert [e.reason for e in every if e.source == "tgnb"] == ["JobPlaced", "JobReleased"]
    assert every[0].reason == "JobPlaced" and every[-1].data["cause"] == "done", every
    events = [e for e in every if e.source == "run"]
    assert events[0].reason == "RunStarted" and events[0].node == slurm
    assert events[-1].reason == "RunExited" and events[-1].data["exit_code"] == 0
    assert (run_dir / "checkpoints" / "checkpoint-6").is_dir()
    assert '@tgnb {"kind": "events"' in log


def test_preempted_by_high_partition_requeues_and_resumes(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    backend = backend_for(tmp_path)
    max_steps = 36
    job = backend.submit(grpo_spec("grpo-preempt", max_steps=max_steps, paced=True))
    cleanup_jobs.append(job)
    run_dir = Path(backend.run_dir(job))
    wait_until(lambda: max(metric_steps(run_dir), default=0) >= 6, 400, what="step 6", every=0.5)
    high = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "--exclusive",
            "-o",
            str(tmp_path / "high.out"),
            "--wrap",
            "sleep 4",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    cleanup_jobs.append(high)
    st = wait_until(
        lambda: (s := backend.status(job)).restart_count >= 1 and s,
        60,
        what="the requeue",
        every=0.5,
    )
    assert st.state in (JobState.REQUEUED, JobState.PENDING, JobState.RUNNING), st
    final = backend.wait(job, timeout=500)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, (final, log[-2000:])
    assert "DUE TO PREEMPTION" in log and f"job {job} requeued (restart 1)" in log

    events = backend.events(job)
    got = [e.reason for e in events]
    assert got.count("RunStarted") == 2 and "SignalReceived" in got, got
    signal_ev = next(e for e in events if e.reason == "SignalReceived")
    resumed = next(e for e in events if e.reason == "RunResumed")
    assert resumed.data["restart_count"] == 1
    # The SIGTERM checkpoint is the one resumed from: no step done before the signal is lost.
    assert resumed.data["step"] == signal_ev.data["step"] >= 6, (signal_ev, resumed)
    assert_steps_continue(run_dir, int(resumed.data["step"]), max_steps)
    ran = [e for e in events if e.source == "run"]
    assert ran[-1].reason == "RunExited" and ran[-1].data["step"] == max_steps


def test_drain_notice_checkpoints_requeues_and_resumes(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    backend = backend_for(tmp_path)
    max_steps = 36
    job = backend.submit(grpo_spec("grpo-drain", max_steps=max_steps, paced=True))
    cleanup_jobs.append(job)
    run_dir = Path(backend.run_dir(job))
    wait_until(lambda: max(metric_steps(run_dir), default=0) >= 6, 400, what="step 6", every=0.5)
    subprocess.run(
        [
            "scontrol",
            "update",
            f"NodeName={slurm}",
            "State=DRAIN",
            "Reason=TogetherPreemptionNotified",
        ],
        check=True,
    )
    # Within the (shortened) drain window the run checkpoints and requeues its own job.
    wait_until(
        lambda: backend.restart_count(job) >= 1,
        DRAIN_WINDOW_S,
        what="the run to requeue itself inside the drain window",
        every=0.5,
    )
    got = reasons(backend, job)
    assert "DrainNoticeReceived" in got and "RunRequeued" in got, got
    assert backend.status(job).state is JobState.REQUEUED  # waits: the node is drained
    subprocess.run(["scontrol", "update", f"NodeName={slurm}", "State=RESUME"], check=True)
    final = backend.wait(job, timeout=500)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, (final, log[-2000:])

    events = backend.events(job)
    drain = next(e for e in events if e.reason == "DrainNoticeReceived")
    # The checkpoint of the step the notice came at: written on the notice, or already there from
    # a periodic save of that very step; complete before the job requeued, and resumed from.
    saved = [
        e for e in events if e.reason == "CheckpointSaved" and e.data["step"] == drain.data["step"]
    ]
    requeued = next(e for e in events if e.reason == "RunRequeued")
    # one requeue, by the script tgnb rendered (the runtime leaves it to the script)
    assert [e.source for e in events if e.reason == "RunRequeued"] == ["tgnb"], events
    resumed = next(e for e in events if e.reason == "RunResumed")
    assert saved and saved[0].time <= requeued.time, (saved, requeued)
    assert resumed.data["step"] == saved[0].data["step"] == drain.data["step"]
    assert_steps_continue(run_dir, int(resumed.data["step"]), max_steps)
    ran = [e for e in events if e.source == "run"]
    assert ran[-1].reason == "RunExited" and ran[-1].data["step"] == max_steps


def test_drained_with_no_preemptible_capacity_resumes_on_a_standard_node(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """``when_short="standard"``: the drain notice checkpoints and requeues the run; while it is
    pending the node comes back as a standard one (no ``preemptible`` feature), so after `wait_s`
    the run's placer lets it start there, and it resumes from the notice's checkpoint."""
    backend = backend_for(tmp_path)
    backend.placer_poll_seconds = 1.0
    max_steps = 36
    policy = RecoveryPolicy(when_short="standard", wait_s=5)
    job = backend.submit(grpo_spec("grpo-standard", max_steps, paced=True, recovery=policy))
    cleanup_jobs.append(job)
    run_dir = Path(backend.run_dir(job))
    cleanup_jobs.append((run_dir / ".tgnb-placer").read_text().strip())
    wait_until(lambda: max(metric_steps(run_dir), default=0) >= 6, 400, what="step 6", every=0.5)
    subprocess.run(
        ["scontrol", "update", f"NodeName={slurm}", "State=DRAIN", "Reason=TogetherPreemption"],
        check=True,
    )
    wait_until(
        lambda: backend.restart_count(job) >= 1, DRAIN_WINDOW_S, what="the requeue", every=0.5
    )
    set_features("")  # the preemptible node is gone; a standard one is there
    subprocess.run(["scontrol", "update", f"NodeName={slurm}", "State=RESUME"], check=True)
    final = backend.wait(job, timeout=500)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, (final, log[-2000:])

    events = backend.events(job)
    got = [e.reason for e in events]
    moved = next(e for e in events if e.data.get("rule") == "standard")
    resumed = next(e for e in events if e.reason == "RunResumed")
    drain = next(e for e in events if e.reason == "DrainNoticeReceived")
    assert got.index("RunRequeued") < got.index("RecoveryDecided", got.index("RunRequeued"))
    assert moved.data["node_class"] == "standard" and moved.time < resumed.time, events
    waited = re.search(r"free for (\d+) s$", moved.message)
    assert waited and int(waited.group(1)) >= 5, moved.message  # after wait_s, not before
    assert resumed.data["step"] == drain.data["step"]  # not a step lost
    assert_steps_continue(run_dir, int(resumed.data["step"]), max_steps)


def test_torchrun_two_processes_with_c10d_rendezvous(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """The rendered torchrun line, for real: two CPU processes on the one node (``gpus_per_node=2``
    with ``--gres`` off stands for two GPUs), a one-node job's ``--standalone`` rendezvous (its own
    free port: jobs sharing a node never compete for one; several nodes meet at the allocation's
    first node with ``--rdzv_backend=c10d``, `golden/elastic_multi_node.sbatch`), both ranks
    train to the end."""
    backend = backend_for(tmp_path)
    spec = grpo_spec("grpo-torchrun", max_steps=4)
    spec = RunSpec(
        name=spec.name,
        train=spec.train,
        resources=Resources(nodes=1, gpus_per_node=2, preemptible=True),
        env=ENV,
    )
    job = backend.submit(spec)
    cleanup_jobs.append(job)
    final = backend.wait(job, timeout=400)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED, (final, log[-2000:])
    script = (Path(backend.run_dir(job)) / "job.sbatch").read_text()
    assert "--standalone --nnodes=1 --nproc_per_node=2" in script, script
    started = next(e for e in backend.events(job) if e.reason == "RunStarted")
    assert started.data["world_size"] == 2
    assert metric_steps(Path(backend.run_dir(job))) == [1, 2, 3, 4]
