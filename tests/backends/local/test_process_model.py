"""The one process model on the local engine (`tgnb.runs.node.processes`), through the session API:
the same DDP script (`tests/backends/ddp_workdir/train.py`, gloo on the CPU, no fallback for a
process started without torchrun) runs at one node, at two, and after a shrink from two nodes to
one, each time under torchrun with RANK, WORLD_SIZE and LOCAL_RANK set. The real runtime and a
real emulator over HTTP; this machine has no GPU, so each node runs one process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.local.command import host_gpus, node_gpus
from tgnb.emulator.testing import EmulatorHandle
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session

pytest.importorskip("torch")
DDP_WORKDIR = Path(__file__).parents[1] / "ddp_workdir"


def ranks(run: Run, phase: str) -> list[dict[str, Any]]:
    assert run.run_dir is not None
    path = run.run_dir / "ranks.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if r["phase"] == phase]


def nodes_now(run: Run) -> tuple[str, ...]:
    return tuple(run.status.nodes) if run.status.state == JobState.RUNNING else ()


def test_a_ddp_script_at_one_node_runs_under_torchrun(session: Session) -> None:
    run = session.launch("train.py", workdir=DDP_WORKDIR, name="ddp-one", nodes=1,
                         recovery=RecoveryPolicy(max_restarts=0))  # fmt: skip
    final = run.wait(timeout=240)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-2000:])
    done = ranks(run, "done")
    assert [(r["rank"], r["world"], r["local_rank"], r["local_world"]) for r in done] == [
        (0, 1, 0, 1)
    ], done


def libraries(pid: int) -> set[str]:
    """The shared libraries process `pid` has mapped (``/proc/PID/maps``)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in maps if ".so" in line}


def test_a_script_runs_supervisor_leaves_the_training_stack_to_the_script(
    session: Session,
) -> None:
    """The supervisor imports torch, transformers and TRL first only for a run it can fork warm
    (a built-in task alone on one node): a script starts a fresh interpreter under torchrun, and
    that import (seconds, several under load) would only delay each of its launches."""
    run = session.launch("train.py", args=["--hold"], workdir=DDP_WORKDIR, name="ddp-supervised",
                         recovery=RecoveryPolicy(max_restarts=0))  # fmt: skip
    wait_until(lambda: len(ranks(run, "started")) == 1, timeout=180)
    supervisor = run.record.jobs[-1].info["pid"]
    loaded = libraries(supervisor)
    assert loaded and not any(name.startswith("libtorch") for name in loaded), sorted(loaded)
    worker = ranks(run, "started")[0]["pid"]
    assert any(name.startswith("libtorch") for name in libraries(worker))  # what it would show
    run.stop()


def test_a_ddp_script_at_two_nodes_then_shrunk_to_one(
    emu: EmulatorHandle, session: Session
) -> None:
    policy = RecoveryPolicy(when_short="shrink", wait_s=1.0)
    run = session.launch("train.py", args=["--hold"], workdir=DDP_WORKDIR, name="ddp-shrinks",
                         nodes=2, min_nodes=1, recovery=policy)  # fmt: skip
    wait_until(lambda: len(ranks(run, "started")) == 2, timeout=180)
    two = ranks(run, "started")
    assert sorted((r["rank"], r["world"], r["local_rank"]) for r in two) == [(0, 2, 0), (1, 2, 0)]
    assert len({r["node"] for r in two}) == 2, two  # one process on each node
    emu.set_capacity(8, session.cluster.id)  # no replacement for the node reclaimed
    session.preempt(nodes_now(run)[0])
    final = run.wait(timeout=300)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-3000:])
    assert run.restart_count == 1
    after = [(r["rank"], r["world"], r["local_rank"], r["restart"]) for r in ranks(run, "done")]
    assert after == [(0, 1, 0, 1)], ranks(run, "done")  # shrunk to one node: still under torchrun


def test_gpus_per_node_are_this_machines_within_the_node_records(tmp_path: Path) -> None:
    """The emulated nodes' GPUs are records, not devices: a local run's processes use this
    machine's (here faked by a device folder and ``CUDA_VISIBLE_DEVICES``)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    assert host_gpus({}, dev) == 0
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    assert host_gpus({}, dev) == 2
    assert host_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, dev) == 4
    assert host_gpus({"CUDA_VISIBLE_DEVICES": ""}, dev) == 0
    assert host_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, dev) == 0
    four = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert node_gpus(8, [8], four) == 4  # the machine's four
    assert node_gpus(8, [8, 8], four) == 2  # shared by the run's two nodes
    assert node_gpus(1, [8], four) == 1  # what the run asked for
    assert node_gpus(8, [2], four) == 2  # what the node has
