"""The one process model in the rendered Kubernetes objects (`tgnb.runs.node.processes`): the DDP
script of `tests/backends/ddp_workdir` runs under torchrun with one process per GPU of its pod (the
``nvidia.com/gpu`` limit; one without a GPU) at one node, at two and elastic down to one; a
``command`` runs once per pod, never under torchrun. No cluster: the objects as they are sent."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.kubernetes.objects import build_objects
from tgnb.runs import node
from tgnb.runs.outcome import UNSAVED, Attempt
from tgnb.runs.recovery import RecoveryPolicy

DDP_WORKDIR = Path(__file__).parents[1] / "ddp_workdir"
SCRIPT = {"algorithm": "script", "script": "train.py"}
COMMAND = {"algorithm": "script", "command": ["torchrun", "--nproc_per_node=8", "train.py"]}


def trainer(train: dict[str, Any], **res: Any) -> dict[str, Any]:
    """The Job's trainer container as it is sent to the API server."""
    shrink = RecoveryPolicy(when_short="shrink") if res.get("min_nodes") else None
    spec = RunSpec(name="ddp", train=train, image="ghcr.io/example/tgnb:0.1",
                   resources=Resources(**res), workdir=str(DDP_WORKDIR), recovery=shrink)  # fmt: skip
    job = next(d for d in build_objects(spec, "research").to_dicts() if d["kind"] == "Job")
    containers = job["spec"]["template"]["spec"]["containers"]
    return dict(next(c for c in containers if c["name"] == "trainer"))


@pytest.mark.parametrize(
    ("res", "torchrun"),
    [
        ({"nodes": 1, "gpus_per_node": 0}, ["--standalone", "--nnodes=1", "--nproc_per_node=1"]),
        ({"nodes": 1, "gpus_per_node": 4}, ["--standalone", "--nnodes=1", "--nproc_per_node=4"]),
        ({"nodes": 2, "gpus_per_node": 0}, ["--nnodes=2", "--nproc_per_node=1"]),
        ({"nodes": 2, "min_nodes": 1, "gpus_per_node": 8}, ["--nnodes=1:2", "--nproc_per_node=8"]),
    ],
)
def test_a_script_runs_under_torchrun_one_process_per_gpu(
    res: dict[str, Any], torchrun: list[str]
) -> None:
    argv = trainer(SCRIPT, **res)["command"]
    assert argv[:3] == ["python", "-m", "tgnb.train.launch"], argv
    assert argv[3 : 3 + len(torchrun)] == torchrun, argv


@pytest.mark.parametrize(
    "res", [{"nodes": 1, "gpus_per_node": 8}, {"nodes": 2, "gpus_per_node": 8}]
)
def test_a_command_runs_once_per_pod_never_under_torchrun(res: dict[str, Any]) -> None:
    container = trainer(COMMAND, **res)
    assert container["command"][:3] == ["python", "-m", "tgnb.train"], container["command"]
    assert "tgnb.train.launch" not in container["command"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"  # the pod keeps its GPUs
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in {e["name"] for e in container["env"]}


@pytest.mark.training
def test_a_command_that_exits_0_on_sigterm_with_nothing_sealed_exits_75_in_its_pod(
    tmp_path: Path,
) -> None:
    """What the pod does, run here: the trainer container's own command (``python -m tgnb.train
    CONFIG --run-dir DIR``, the config from the run's ConfigMap, the workdir where the init
    container unpacks it), given a script with no hook that exits 0 on SIGTERM (the kubelet's
    signal on a drain or an eviction). It records "stopped without a checkpoint" and exits 75,
    which the pod failure policy ignores (recreated, uncounted); before, its 0 completed the
    Job's index as a success. Left alone, the same command exits 0: done. Only the cluster is
    missing: the paths of the mounts are replaced by local ones."""
    quits = Path(__file__).parents[2] / "session" / "exits_workdir" / "quits.py"
    codes = []
    for steps, stop in (("400", True), ("3", False)):
        train = {"algorithm": "script", "command": ["python", "quits.py", steps]}
        spec = RunSpec(name="quits", train=train, image="ghcr.io/example/tgnb:0.1",
                       resources=Resources(nodes=1, gpus_per_node=0))  # fmt: skip
        objects = build_objects(spec, "research").to_dicts()
        job = next(d for d in objects if d["kind"] == "Job")
        ignored = {"containerName": "trainer", "operator": "In", "values": [75]}
        assert {"action": "Ignore", "onExitCodes": ignored} in job["spec"]["podFailurePolicy"][
            "rules"
        ]
        argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert argv[:3] == ["python", "-m", "tgnb.train"] and argv[4] == "--run-dir", argv
        config, run_dir = tmp_path / f"config-{steps}.yaml", tmp_path / f"run-{steps}"
        config.write_text(
            next(d for d in objects if d["kind"] == "ConfigMap")["data"]["config.yaml"]
        )
        (run_dir / node.WORKDIR).mkdir(parents=True)
        shutil.copy(quits, run_dir / node.WORKDIR / "quits.py")
        local = [sys.executable, *argv[1:3], str(config), "--run-dir", str(run_dir)]
        proc = subprocess.Popen(local, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if stop:
            wait_until(lambda d=run_dir: Attempt.read(d).last_step >= 5, timeout=120)  # type: ignore[misc]
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        codes.append(proc.returncode)
        attempt = Attempt.read(run_dir)
        if stop:
            assert attempt.exit_reason == UNSAVED, out
            step = attempt.last_step
            assert f"stopped without a checkpoint at step {step}: {step} steps lost" in out
        else:
            assert attempt.exit_reason is None and attempt.last_step == 3, out
    assert codes == [75, 0]
