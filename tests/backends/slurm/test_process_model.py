"""The one process model on a real Slurm (`tgnb.runs.node.processes`): the DDP script of
`tests/backends/ddp_workdir` (gloo on the CPU, no fallback for a process started without torchrun)
submitted by a `SlurmBackend` with its defaults to the one-node cluster of `.ci/slurm-up`, whose
node has no GPU (GRES ``(null)``): one process under torchrun, RANK/WORLD_SIZE/LOCAL_RANK set, no
``--gres``, whatever the run's ``gpus_per_node`` (its default, a whole Together node: 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm import SlurmBackend

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("torch")
DDP_WORKDIR = Path(__file__).parents[1] / "ddp_workdir"


def test_a_ddp_script_on_a_node_without_gpu_runs_one_process_under_torchrun(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    backend = SlurmBackend(runs_root=tmp_path / "runs", poll_seconds=1.0)
    assert backend.node_gpus() == 0  # the node's GRES, as sinfo shows it
    spec = RunSpec(
        name="ddp-slurm",
        train={"algorithm": "script", "script": "train.py"},
        resources=Resources(nodes=1, preemptible=True),
        workdir=str(DDP_WORKDIR),
    )
    script, _ = backend.render(spec)
    assert "--gres" not in script and "--nproc_per_node=1" in script, script
    job = backend.submit(spec)
    cleanup_jobs.append(job)
    final = backend.wait(job, timeout=300)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED, (final, log[-3000:])
    rows = (Path(backend.run_dir(job)) / "ranks.jsonl").read_text().splitlines()
    done = [r for r in map(json.loads, rows) if r["phase"] == "done"]
    assert [(r["rank"], r["world"], r["local_rank"], r["node"]) for r in done] == [
        (0, 1, 0, slurm)
    ], done
