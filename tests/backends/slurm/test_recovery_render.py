"""The recovery policy rendered into the sbatch script (`tgnb.backends.slurm.render`): the node
range, the "resume me" codes and the failure budget, checked as text, by ``bash -n``, by a real
``sbatch --test-only`` and by real jobs on the one-node cluster of `.ci/slurm-up` (the runtime is
``fake_train.sh`` there, as in test_slurm_jobs.py)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm.render import RenderOptions, directives, render_script
from tgnb.runs.recovery import RecoveryPolicy

from .conftest import fake_train
from .test_slurm_jobs import make_backend

RUN_DIR = "/data/home/alice/tgnb-runs/r"


def spec(nodes: int = 2, min_nodes: int | None = 1, **policy: object) -> RunSpec:
    return RunSpec(
        name="r",
        train={},
        env=fake_train(sleep=1),
        resources=Resources(nodes=nodes, min_nodes=min_nodes, gpus_per_node=0),
        recovery=RecoveryPolicy(**policy) if policy else None,  # type: ignore[arg-type]
    )


def nodes_flag(s: RunSpec) -> str:
    return next(d for d in directives(s, RUN_DIR, RenderOptions()) if d.startswith("--nodes"))


def test_the_node_range_comes_from_the_policy() -> None:
    assert nodes_flag(spec(when_short="shrink")) == "--nodes=1-2"
    assert nodes_flag(spec()) == "--nodes=1-2"  # min_nodes and no policy: shrink, as before
    assert nodes_flag(spec(when_short="wait")) == "--nodes=2"  # wait: all nodes or none
    assert nodes_flag(spec(min_nodes=None)) == "--nodes=2"


def test_resume_codes_and_failure_budget_are_rendered_once() -> None:
    policy = RecoveryPolicy(max_restarts=5, backoff_s=1.5, backoff_max_s=7, resume_codes=(75, 76))
    script = render_script(dataclasses.replace(spec(), recovery=policy), RUN_DIR)
    assert script.count("--requeue") == 1
    assert 'case "$rc" in 75|76) resume=1 ;; *) resume=0 ;; esac' in script
    assert 'case "$rc" in 2|74|77|78) final=1 ;; *) final=0 ;; esac' in script
    assert "-lt 5 ]; then" in script
    (line,) = [x.strip() for x in script.splitlines() if 'case "$failures"' in x]
    assert (
        line == 'case "$failures" in 1) delay=1.5 ;; 2) delay=3 ;; 3) delay=6 ;; *) delay=7 ;; esac'
    )
    assert "a failure is final" in render_script(spec(max_restarts=0), RUN_DIR)
    if bash := shutil.which("bash"):
        subprocess.run([bash, "-n"], input=script, text=True, check=True)
        for failures in range(1, 6):  # the shell's delay is the policy's, for every count
            done = subprocess.run([bash, "-c", f'failures={failures}; {line}; echo "$delay"'],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            assert float(done.stdout) == policy.backoff(failures)


@pytest.mark.slurm
def test_sbatch_accepts_the_shrinking_range_where_all_nodes_cannot_start(
    slurm: str, tmp_path: Path
) -> None:
    """Real Slurm, one node: ``--nodes=1-2`` (shrink) can start, ``--nodes=2`` (wait) cannot."""
    for policy, ok in (("shrink", True), ("wait", False)):
        path = tmp_path / f"{policy}.sbatch"
        path.write_text(render_script(spec(when_short=policy), str(tmp_path / policy)))
        done = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True)
        assert (done.returncode == 0) is ok, (policy, done.stderr)


@pytest.mark.slurm
def test_a_failure_is_requeued_within_the_budget_and_final_beyond_it(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make_backend(tmp_path)
    one = RunSpec(name="fails-once", train={}, env=fake_train(sleep=1, first_exit=3),
                  resources=Resources(nodes=1, gpus_per_node=0),
                  recovery=RecoveryPolicy(max_restarts=1, backoff_s=1))  # fmt: skip
    job = backend.submit(one)
    cleanup_jobs.append(job)
    final = backend.wait(job, timeout=120)
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, final
    assert "tgnb: exit 3, failure 1 of 1: requeue in 1s" in "\n".join(backend.logs(job))
    none = RunSpec(name="fails-final", train={}, env=fake_train(sleep=1, first_exit=3),
                   resources=Resources(nodes=1, gpus_per_node=0),
                   recovery=RecoveryPolicy(max_restarts=0))  # fmt: skip
    job = backend.submit(none)
    cleanup_jobs.append(job)
    final = backend.wait(job, timeout=120)
    assert final.state is JobState.FAILED and final.restart_count == 0, final


def test_a_class_move_renders_the_run_on_preemptible_nodes() -> None:
    """`standard` (at any wait_s) and a deadline render: the run's job asks for preemptible nodes,
    and its placer job (test_placer.py) changes that while it is pending."""
    for policy in ({"when_short": "standard", "wait_s": 60}, {"deadline": 2e9}):
        script = render_script(spec(min_nodes=None, **policy), RUN_DIR)
        assert "#SBATCH --constraint=preemptible" in script and "#SBATCH --nodes=2" in script
