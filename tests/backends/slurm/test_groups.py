"""A run as TorchFT replica groups on Slurm (`tgnb.backends.slurm.groups`, issue 50): one array
task per group, each a one-node run with the groups' contract (`tgnb.runs.ft`), and the lighthouse
in a job of its own off the preemptible nodes, whose address the groups read from the run
directory. Golden files pin both scripts (``TGNB_UPDATE_GOLDEN=1`` regenerates them); the real
Slurm here checks that sbatch takes them (``--test-only``) and that the backend submits the
lighthouse first, the groups after it, and refuses a cluster with no standard node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm import SlurmBackend, groups
from tgnb.backends.slurm.render import render_script
from tgnb.errors import ValidationError
from tgnb.runs import ft
from tgnb.runs.trainconfig import from_dict

from .conftest import STANDARD_NODE, set_features

GOLDEN = Path(__file__).parent / "golden"
RUN_DIR = "/data/home/alice/tgnb-runs/ft-groups"
FT = from_dict({"script": "train.py", "fault_tolerance": "torchft"})


def _spec(nodes: int = 3, **kw: object) -> RunSpec:
    return RunSpec(
        name="ft-groups",
        train=FT,
        resources=Resources(nodes=nodes, gpus_per_node=8),
        run_dir=RUN_DIR,
        **kw,  # type: ignore[arg-type]
    )


def test_lighthouse_golden() -> None:
    script = groups.render_lighthouse(_spec(), RUN_DIR, "/opt/venv/bin/python")
    path = GOLDEN / "torchft_lighthouse.sbatch"
    if os.environ.get("TGNB_UPDATE_GOLDEN"):
        path.write_text(script, encoding="utf-8")
    assert script == path.read_text(encoding="utf-8"), (
        f"regenerate with TGNB_UPDATE_GOLDEN=1: {path}"
    )


def test_each_group_is_an_array_task_of_one_node_with_the_contract() -> None:
    script = render_script(_spec(), RUN_DIR)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "#SBATCH --array=0-2" in script and "#SBATCH --nodes=1" in script
    assert "#SBATCH --requeue" in script and "#SBATCH --constraint=preemptible" in script
    assert f"--output={RUN_DIR}/slurm-%A_%a.out" in script
    assert "--standalone --nnodes=1 --nproc_per_node=8" in script  # its own rendezvous
    assert "rdzv_endpoint" not in script and "MASTER_ADDR" not in script
    for name in ft.group_env("x", 0, 3):  # every name of the contract, from the contract
        assert re.search(rf"^export {name}=", script, re.M), name
    assert 'export REPLICA_GROUP_ID="$SLURM_ARRAY_TASK_ID"' in script
    assert "export NUM_REPLICA_GROUPS=3" in script
    assert f'"http://$(cat "$TGNB_RUN_DIR/{groups.ADDRESS_FILE}")"' in script
    assert ".tgnb-failures-$SLURM_ARRAY_TASK_ID" in script  # each group its own budget
    plain = render_script(RunSpec(name="plain", train=from_dict({"script": "train.py"})), "/runs/p")
    assert "--array" not in plain and "REPLICA_GROUP_ID" not in plain


@pytest.mark.parametrize("gpus", [0, 2, 4])
def test_a_group_of_several_processes_is_one_torchrun_of_its_own(gpus: int) -> None:
    """A group is its node's processes (issue 50): one task on the node, one torchrun with one
    process per GPU and its own rendezvous, the contract exported before it (every rank inherits
    it); the groups never share a rendezvous."""
    spec = RunSpec(name="ft-groups", train=FT, resources=Resources(nodes=2, gpus_per_node=gpus))
    script = render_script(spec, RUN_DIR)
    nproc = max(1, gpus)
    assert "#SBATCH --nodes=1" in script and "#SBATCH --ntasks-per-node=1" in script
    assert (f"#SBATCH --gres=gpu:{gpus}" in script) == (gpus > 0), script
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert f"--standalone --nnodes=1 --nproc_per_node={nproc} -m tgnb.train" in launch, launch
    assert "rdzv" not in script and "node_rank" not in script and "MASTER_ADDR" not in script
    before = script[: script.index(launch)]
    for name in ft.group_env("x", 0, 2):
        assert re.search(rf"^export {name}=", before, re.M), name


def test_lighthouse_script_is_bash_off_the_preemptible_nodes() -> None:
    spec = _spec(env={ft.HEARTBEAT_TIMEOUT_ENV: "3000"}, account="research")
    script = groups.render_lighthouse(spec, RUN_DIR, "python", partition="standard")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "#SBATCH --partition=standard" in script and "#SBATCH --account=research" in script
    assert "preemptible" not in script.replace("preemptible nodes", "") and "gres" not in script
    assert "torchft_lighthouse --min_replicas 1" in script  # on PATH: python is not a path
    assert "--heartbeat_timeout_ms 3000" in script  # the run's env tunes it (tgnb.runs.ft)
    assert '--bind "0.0.0.0:$PORT"' in script


SINFO = "gpu-dp-1|preemptible\ngpu-dp-2|preemptible,h100\ngpu-std-1|(null)\ngpu-std-1|(null)\n"


def test_nodes_by_class_from_sinfo() -> None:
    assert groups.preemptible_nodes(SINFO) == ["gpu-dp-1", "gpu-dp-2"]
    assert groups.standard_nodes(SINFO) == ["gpu-std-1"]
    assert groups.standard_nodes("gpu-dp-1|preemptible\n") == []


def _task(task: str, state: str, restarts: int = 0, exit_code: str = "0:0") -> str:
    return (
        f"JobId=10{task[-1]} ArrayJobId=100 ArrayTaskId={task} JobName=ft-groups "
        f"JobState={state} Reason=None Requeue=1 Restarts={restarts} ExitCode={exit_code} "
        f"NodeList=gpu-dp-{task[-1]} EndTime=Unknown"
    )


def test_the_runs_status_is_its_groups_together() -> None:
    running = groups.array_status([_task("0", "RUNNING"), _task("1", "PENDING", restarts=1)])
    assert running.state is JobState.RUNNING and running.restart_count == 1
    assert running.detail == "1 of 2 group job(s) running"
    waiting = groups.array_status([_task("0-2", "PENDING")])
    assert waiting.state is JobState.PENDING
    done = groups.array_status([_task("0", "COMPLETED"), _task("1", "COMPLETED")])
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    failed = groups.array_status([_task("0", "COMPLETED"), _task("1", "FAILED", 0, "1:0")])
    assert failed.state is JobState.FAILED and failed.exit_code == 1


@pytest.mark.slurm
def test_sbatch_takes_both_scripts(slurm: str, tmp_path: Path) -> None:
    """Real sbatch (``--test-only``: checked by the controller, not queued): the group array and
    the lighthouse in the ``standard`` partition (the test cluster's node with no feature)."""
    run_dir = str(tmp_path / "ft-groups")
    os.makedirs(run_dir)
    spec = RunSpec(
        name="ft-groups",
        train=FT,
        resources=Resources(nodes=2, gpus_per_node=0),
    )
    for name, script in (
        ("groups.sbatch", render_script(spec, run_dir)),
        ("lighthouse.sbatch", groups.render_lighthouse(spec, run_dir, sys.executable, "standard")),
    ):
        (tmp_path / name).write_text(script, encoding="utf-8")
        out = subprocess.run(
            ["sbatch", "--test-only", str(tmp_path / name)], capture_output=True, text=True
        )
        assert out.returncode == 0 and "to start at" in out.stderr, (name, out.stderr)


@pytest.mark.slurm
def test_no_standard_node_is_refused_before_submitting(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """The test cluster's standard node made preemptible (``cleanup_jobs`` turns it back): every
    node is preemptible, and the lighthouse would have no node."""
    backend = SlurmBackend(runs_root=tmp_path, gres=False)
    spec = RunSpec(
        name="ft-none",
        train=FT,
        resources=Resources(nodes=2, gpus_per_node=0),
    )
    set_features("preemptible", STANDARD_NODE)
    with pytest.raises(ValidationError, match="lighthouse_partition=") as exc:
        backend.preflight(spec)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "ft-none").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_the_lighthouse_job_publishes_its_address_and_ends_with_the_groups(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Real Slurm and the real ``torchft_lighthouse``: the lighthouse's job writes a HOST:PORT that
    answers, and ends (removing it) once the groups' array has left the queue. (The whole run,
    a group preempted: test_groups_run.py.)"""
    import socket
    import time

    run_dir = tmp_path / "ft-house"
    run_dir.mkdir()
    spec = RunSpec(name="ft-house", train=FT, resources=Resources(nodes=2, gpus_per_node=0))
    script = run_dir / groups.LIGHTHOUSE_SCRIPT
    script.write_text(groups.render_lighthouse(spec, str(run_dir), sys.executable, "standard"))
    house = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True
    ).stdout.strip()
    cleanup_jobs.append(house)
    address = run_dir / groups.ADDRESS_FILE
    deadline = time.monotonic() + 120
    while not address.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    host, _, port = address.read_text().strip().rpartition(":")
    assert host == socket.gethostname() and port.isdigit()
    socket.create_connection(("127.0.0.1", int(port)), 5).close()  # it listens there
    array = subprocess.run(  # stands for the groups: an array that ends at once
        ["sbatch", "--parsable", "--array=0-1", "--wrap=true", f"--chdir={run_dir}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    cleanup_jobs.append(array)
    (run_dir / groups.GROUPS_JOB_FILE).write_text(array + "\n")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", house], capture_output=True, text=True)
        if not queued.stdout.strip():
            break
        time.sleep(1)
    assert not queued.stdout.strip(), "the lighthouse's job is still queued after its groups"
    assert not address.exists()
    log = next(run_dir.glob("lighthouse-*.out")).read_text()
    assert f"the replica groups (job {array}) have ended" in log


def test_a_group_runs_log_is_its_checkpointing_groups(tmp_path: Path) -> None:
    """The run's log (`SlurmBackend.log_path`): an array's is the log of group
    `tgnb.runs.ft.CHECKPOINT_GROUP` (``slurm-ARRAY_0.out``); a plain run's is its own."""
    backend = SlurmBackend(runs_root=tmp_path, gres=False)
    for job, name, marker in (("41", "ft", "41\n"), ("42", "plain", None)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        if marker is not None:  # what submit writes for the lighthouse beside the groups
            (run_dir / groups.GROUPS_JOB_FILE).write_text(marker)
        backend.attach(job, run_dir)
    assert backend.log_path("41") == f"{tmp_path}/ft/slurm-41_{ft.CHECKPOINT_GROUP}.out"
    assert backend.log_path("42") == f"{tmp_path}/plain/slurm-42.out"
