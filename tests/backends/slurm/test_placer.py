"""The Slurm placer (`tgnb.backends.slurm.placer`): a run whose recovery policy moves between node
classes gets a second job that, while the run's job is pending, makes it ask for preemptible or
standard nodes by `tgnb.runs.recovery.decide`.

The real-Slurm tests use the one-node cluster of `.ci/slurm-up` and ``fake_train.sh`` as the runtime
(as test_slurm_jobs.py does); the placer itself is the real one. A preemption is the run exiting 75
(checkpointed after a notice) while the test turns the node into a standard one at run time
(``scontrol update NodeName=... AvailableFeatures=``: Together's standard nodes carry no feature),
so no preemptible capacity is left when the job is requeued; turning it back gives the capacity
back. GPUs cannot be had here: the node records with GPUs are written out by hand."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm.placer import (
    CONFIG_NAME,
    JOB_FILE,
    SlurmNode,
    SlurmPlacement,
    render_placer,
    slurm_facts,
)
from tgnb.backends.slurm.records import parse_fields
from tgnb.runs.placing import NoAnswer
from tgnb.runs.recovery import RecoveryPolicy, decide
from tgnb.runs.runfile import PlacerConfig

from .conftest import NODE, fake_train, set_features
from .test_slurm_jobs import make_backend

GPU_NODES = [
    "NodeName=gpu-preemptible-dp-0 CPUAlloc=4 CPUTot=64 AvailableFeatures=preemptible "
    "ActiveFeatures=preemptible State=MIXED Partitions=batch CfgTRES=cpu=64,mem=900G,gres/gpu=8 "
    "AllocTRES=cpu=4,gres/gpu=8",
    "NodeName=gpu-preemptible-dp-1 CPUAlloc=0 CPUTot=64 AvailableFeatures=preemptible "
    "ActiveFeatures=preemptible State=IDLE+DRAIN Partitions=batch CfgTRES=cpu=64,gres/gpu=8 "
    "AllocTRES=",
    "NodeName=gpu-dp-0 CPUAlloc=0 CPUTot=64 AvailableFeatures=(null) ActiveFeatures= "
    "State=IDLE Partitions=batch CfgTRES=cpu=64,mem=900G,gres/gpu=8 AllocTRES=",
]


def spec(name: str, policy: RecoveryPolicy, max_steps: int = 100, **knobs: int) -> RunSpec:
    return RunSpec(
        name=name,
        train={"max_steps": max_steps},
        resources=Resources(nodes=1, gpus_per_node=0, preemptible=True),
        env=fake_train(**knobs),
        recovery=policy,
    )


def config(gpus: int = 8, **more: Any) -> PlacerConfig:
    base = {"run": "r", "policy": {}, "nodes": 1, "min_nodes": None, "gpus_per_node": gpus,
            "cpus_per_task": 1, "partition": "batch", "max_steps": None, "launched": 0.0}  # fmt: skip
    return PlacerConfig.from_dict({**base, **more})


def test_nodes_are_judged_by_their_feature_state_and_free_gpus(tmp_path: Path) -> None:
    nodes = [SlurmNode.from_fields(parse_fields(line)) for line in GPU_NODES]
    assert [(n.kind, n.up, n.free_gpus) for n in nodes] == [
        ("preemptible", True, 0),  # all 8 GPUs taken
        ("preemptible", False, 8),  # drained: a preemption notice
        ("standard", True, 8),
    ]
    f = slurm_facts(config(), nodes, short_for=700.0, run_dir=tmp_path, now=1.0)
    assert dict(f.free) == {"preemptible": 0, "standard": 1}
    assert (f.allocated_gpus, f.desired_gpus) == (8, 8)
    d = decide(RecoveryPolicy(when_short="standard"), f)
    assert (d.action, d.node_class, d.rule) == ("start", "standard", "standard"), d
    assert d.reason == "moved to 1 standard node: 8 of 8 preemptible GPUs allocated for 12 min"
    # another partition's run sees none of them
    other = slurm_facts(config(partition="other"), nodes, 0.0, tmp_path, 1.0)
    assert dict(other.free) == {"preemptible": 0, "standard": 0}


def test_a_job_with_no_partition_counts_only_its_default_partitions_nodes(tmp_path: Path) -> None:
    """A run submitted with no ``--partition`` is in the cluster's default partition: a standard
    node of another partition (the test cluster's ``standard``, a lighthouse's) is no room for
    it, as the controller holds the job (``Partition=low``)."""
    lines = [
        "NodeName=localhost CPUAlloc=1 CPUTot=2 AvailableFeatures=(null) ActiveFeatures=(null) "
        "State=MIXED Partitions=low,high CfgTRES=cpu=2 AllocTRES=cpu=1",
        "NodeName=standard CPUAlloc=0 CPUTot=1 AvailableFeatures=(null) ActiveFeatures=(null) "
        "State=IDLE Partitions=standard CfgTRES=cpu=1 AllocTRES=",
    ]
    nodes = [SlurmNode.from_fields(parse_fields(line)) for line in lines]
    unset = config(gpus=0, partition=None)
    held = slurm_facts(unset, nodes, 0.0, tmp_path, 1.0, job_partitions=("low",))
    assert dict(held.free) == {"preemptible": 0, "standard": 1}  # localhost's free CPU only
    busy = [dataclasses.replace(nodes[0], free_cpus=0), nodes[1]]
    full = slurm_facts(unset, busy, 0.0, tmp_path, 1.0, job_partitions=("low",))
    assert dict(full.free) == {"preemptible": 0, "standard": 0}  # not the other partition's node
    assert dict(slurm_facts(unset, busy, 0.0, tmp_path, 1.0).free)["standard"] == 1  # unknown


def test_the_placer_script_and_config(tmp_path: Path) -> None:
    policy = RecoveryPolicy(when_short="standard", wait_s=30)
    script, cfg = render_placer(
        spec("r", policy, max_steps=9), "/data/runs/r", "/opt/py/bin/python", 1234.5
    )
    assert "#SBATCH --cpus-per-task=1" in script and "--constraint" not in script
    assert "#SBATCH --requeue" in script and "#SBATCH --gres" not in script
    last = script.strip().splitlines()[-1]
    assert last == ('exec /opt/py/bin/python -m tgnb.backends.slurm /data/runs/r/placer.json "$1"')
    data = json.loads(cfg)
    assert data["policy"]["wait_s"] == 30 and data["max_steps"] == 9 and data["launched"] == 1234.5
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def features_of(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    return parse_fields(out.stdout).get("Features", "")


def decisions(backend: Any, job: str) -> list[tuple[str, str, str]]:
    return [
        (e.data["action"], e.data["node_class"], e.data["rule"])
        for e in backend.events(job)
        if e.reason == "RecoveryDecided"
    ]


@pytest.mark.slurm
@pytest.mark.slow
def test_standard_moves_to_a_standard_node_and_back_at_the_next_restart(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Restart 0 on the preemptible node; preempted (exit 75) once the node is standard: after
    `wait_s` pending the placer clears the constraint and restart 1 runs on the standard node;
    preempted again once it is preemptible again: restart 2 asks for preemptible nodes."""
    backend = make_backend(tmp_path)
    backend.placer_poll_seconds = 1.0
    policy = RecoveryPolicy(when_short="standard", wait_s=3)
    job = backend.submit(spec("to-standard", policy, sleep=8, first_exit=75, exits=2))
    cleanup_jobs.append(job)
    run_dir = Path(backend.run_dir(job))
    placer_job = (run_dir / JOB_FILE).read_text().strip()
    cleanup_jobs.append(placer_job)
    assert json.loads((run_dir / CONFIG_NAME).read_text())["policy"]["when_short"] == "standard"
    wait_until(
        lambda: backend.status(job).state is JobState.RUNNING,
        120,
        what="restart 0 running",
        every=0.5,
    )
    set_features("")  # the preemptible capacity is gone: the node left is a standard one

    st = wait_until(
        lambda: (s := backend.status(job)).restart_count == 1 and s.state is JobState.RUNNING and s,
        240,
        what="restart 1 running",
        every=0.5,
    )
    assert st.nodes == (NODE,)
    assert "preemptible" not in features_of(job)
    assert ("start", "standard", "standard") in decisions(backend, job)
    moved = next(e for e in backend.events(job) if e.data.get("rule") == "standard")
    assert moved.message.startswith("moved to 1 standard node: 0 preemptible node(s) free for")
    set_features("preemptible")  # capacity is back while the run is on the standard node

    final = backend.wait(job, timeout=300)
    assert final.state is JobState.SUCCEEDED and final.restart_count == 2, final
    got = decisions(backend, job)
    back = got.index(("start", "preemptible", "full"), got.index(("start", "standard", "standard")))
    assert back > 0, got  # the next restart asked for preemptible nodes again
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert "restart=2" in log and log.count("fake-train: exiting 75") == 2, log
    # the placer ends with the run
    wait_until(
        lambda: backend.status(placer_job).state.finished, 60, what="the placer to end", every=0.5
    )
    placer_log = next(run_dir.glob("placer-*.out")).read_text()
    assert f"job {job} has ended" in placer_log, placer_log


@pytest.mark.slurm
@pytest.mark.slow
def test_a_deadline_at_risk_takes_the_standard_node(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """A run at step 1 of 1,000 with two minutes to its deadline, preempted with no preemptible
    capacity left: its slack has run out, so the placer moves it to the standard node at once
    (its `wait_s` is the default 600 s)."""
    backend = make_backend(tmp_path)
    backend.placer_poll_seconds = 1.0
    policy = RecoveryPolicy(deadline=time.time() + 120)
    job = backend.submit(spec("deadline", policy, 1000, sleep=4, first_exit=75, step=1))
    cleanup_jobs.append(job)
    cleanup_jobs.append((Path(backend.run_dir(job)) / JOB_FILE).read_text().strip())
    wait_until(
        lambda: backend.status(job).state is JobState.RUNNING,
        120,
        what="restart 0 running",
        every=0.5,
    )
    set_features("")
    final = backend.wait(job, timeout=300)
    assert final.state is JobState.SUCCEEDED and final.restart_count == 1, final
    moved = [e for e in backend.events(job) if e.data.get("rule") == "deadline"]
    assert moved and moved[0].data["node_class"] == "standard", backend.events(job)
    assert moved[0].message.startswith("moved to standard: slack ran out:"), moved[0].message


@pytest.mark.slurm
def test_cancel_stops_the_placer_too(slurm: str, tmp_path: Path, cleanup_jobs: list[str]) -> None:
    backend = make_backend(tmp_path)
    job = backend.submit(spec("cancelled", RecoveryPolicy(when_short="standard"), sleep=60))
    placer_job = (Path(backend.run_dir(job)) / JOB_FILE).read_text().strip()
    cleanup_jobs += [job, placer_job]
    backend.cancel(job)
    assert backend.wait(job, timeout=60).state is JobState.CANCELLED
    assert backend.wait(placer_job, timeout=60).state is JobState.CANCELLED


@pytest.mark.slurm
def test_no_preemptible_node_at_all_is_refused_with_the_fix(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """sbatch refuses a ``--constraint=preemptible`` job when no node has the feature (the
    target is 0): the error says that, and what to do, and nothing is queued."""
    from tgnb.errors import BackendError

    backend = make_backend(tmp_path)
    set_features("")
    with pytest.raises(BackendError, match=r"raise the preemptible target .* preemptible=False"):
        backend.submit(spec("no-capacity", RecoveryPolicy(when_short="standard"), sleep=1))
    queued = subprocess.run(["squeue", "-h", "-n", "no-capacity"], capture_output=True, text=True)
    assert queued.stdout.strip() == ""


@pytest.mark.slurm
@pytest.mark.slow
def test_a_run_on_the_standard_node_goes_back_once_preemptible_capacity_is_back(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Restart 0 on the preemptible node, preempted (exit 75) once the node is standard; restart 1
    is placed on the standard node (wait_s=0). While it runs the node becomes preemptible again:
    the placer requeues it at once (Slurm signals it: it checkpoints, exits 75), and restart 2
    asks for preemptible nodes. The one-node cluster has 2 CPUs, the run's job takes one: the
    run's own placer job is cancelled, and the same placer (`SlurmPlacement`, real ``scontrol``
    commands) is stepped here instead, so that the node has room for the move back."""
    backend = make_backend(tmp_path)
    policy = RecoveryPolicy(when_short="standard", wait_s=0)
    job = backend.submit(spec("go-back", policy, sleep=30, first_exit=75, exits=1))
    cleanup_jobs.append(job)
    run_dir = Path(backend.run_dir(job))
    placer_job = (run_dir / JOB_FILE).read_text().strip()
    cleanup_jobs.append(placer_job)
    subprocess.run(["scancel", placer_job], check=True, timeout=15)
    engine = SlurmPlacement(run_dir / CONFIG_NAME, job)

    def step_until(what: str, cond: Any, timeout: float = 240) -> Any:
        def tick() -> Any:
            with contextlib.suppress(NoAnswer):
                engine.loop.step()
            return cond()

        return wait_until(tick, timeout, what=what, every=1.0)

    step_until("restart 0 running", lambda: backend.status(job).state is JobState.RUNNING)
    set_features("")  # the preemptible capacity is gone: restart 0 exits 75, then restart 1
    st = step_until(
        "restart 1 running",
        lambda: (s := backend.status(job)).restart_count == 1 and s.state is JobState.RUNNING,
    )
    assert st and "preemptible" not in features_of(job)
    for _ in range(3):  # on the standard node, no preemptible capacity: it stays
        d = engine.loop.step()
        assert d is not None and d.action == "keep", d
    set_features("preemptible")  # capacity is back while the run is on the standard node
    d = engine.loop.step()
    assert d is not None and d.reason == "back to preemptible: on 1 preemptible node", d
    step_until("the run to end", lambda: backend.status(job).state.finished, 300)
    final = backend.status(job)
    assert final.state is JobState.SUCCEEDED and final.restart_count == 2, final
    got = decisions(backend, job)
    assert ("start", "preemptible", "full") in got[got.index(("start", "standard", "standard")) :]
    said = [e.message for e in backend.events(job) if e.reason == "RecoveryDecided"]
    assert "back to preemptible: on 1 preemptible node" in said, said
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert "fake-train: TERM" in log and log.count("fake-train: exiting 75") == 1, log
    assert "restart=2" in log and features_of(job) == "preemptible"
