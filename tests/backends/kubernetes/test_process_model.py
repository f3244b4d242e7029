"""The one process model in the rendered Kubernetes objects (`tgnb.runs.node.processes`): the DDP
script of `tests/backends/ddp_workdir` runs under torchrun with one process per GPU of its pod (the
``nvidia.com/gpu`` limit; one without a GPU) at one node, at two and elastic down to one; a
``command`` runs once per pod, never under torchrun. No cluster: the objects as they are sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.kubernetes.objects import build_objects
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
