"""Two processes under torchrun (``python -m tgnb.train.launch``: torchrun's own launcher in-process,
gloo on the CPU), tiny DPO through the real ``python -m tgnb.train``, DDP: three SIGTERMs, each to
one rank only (rank 1, then 0, then 1). Each time both ranks checkpoint at the same step (every rank
its DCP shard and RNG file, rank 0 the marker) and the launcher exits 75, not torchrun's 1; each
restart resumes both ranks from it; the run finishes at max_steps with every step logged once and
the same weights as an uninterrupted 2-rank run (within 1e-5). Timeouts guard against deadlocks."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck
from tgnb.train import launch

from .conftest import torchrun, worker_pids


def test_the_launcher_keeps_tgnbs_exit_codes() -> None:
    from types import SimpleNamespace as F

    assert launch.exit_code({0: F(exitcode=75), 1: F(exitcode=75)}) == EXIT_PREEMPTED == 75
    assert launch.exit_code({0: F(exitcode=-15), 1: F(exitcode=75)}) == 75  # killed by the agent
    assert launch.exit_code({0: F(exitcode=74)}) == 74
    # a bad config stays 2 (final for the recovery policy), not a retried failure (1)
    assert launch.exit_code({0: F(exitcode=2), 1: F(exitcode=2)}) == 2
    assert launch.exit_code({0: F(exitcode=75), 1: F(exitcode=1)}) == 1
    assert launch.exit_code({0: F(exitcode=-9)}) == 1


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ddp_preempted_three_times_through_one_rank_matches_the_uninterrupted_run(
    launcher: Any, tmp_path: Path
) -> None:
    from tgnb.tasks import assets

    # Build the tiny model once up front: two ranks building it at once can collide.
    assets.tiny_path(3, tmp_path / "home" / "assets")
    argv = torchrun(2)
    steps = 24
    common = ("algorithm=dpo", "model=tiny", "seed=3", "checkpoint.watch_drain=false")
    common += ("checkpoint.every_steps=5", f"max_steps={steps}")
    # 25 global batches of 16 (8 per rank): the 24 steps in one epoch, each rank tokenizing 400
    # rows at each of its starts instead of the default 2000
    common += ("dataset_size=400",)
    run_dir = tmp_path / "ddp"
    # the uninterrupted reference trains meanwhile (as in test_equivalence): its own directory
    # and rendezvous port, the same pre-built model
    reference = launcher.start(tmp_path / "reference", *common, argv=argv)
    stops: list[int] = []
    for target in (1, 0, 1):
        run = launcher.start(run_dir, *common, argv=argv)
        run.wait_step((stops[-1] if stops else 0) + 2, timeout=600)
        pids = wait_until(lambda r=run: len(p := worker_pids(r.proc.pid)) >= 2 and p, 60)
        assert sorted(pids) == [0, 1], pids
        os.kill(pids[target], signal.SIGTERM)
        assert run.wait(300) == EXIT_PREEMPTED, run.tail()
        log = run.tail(200_000)
        found = re.findall(r"tgnb: rank (\d) preempted at step (\d+)", log)
        stopped = {int(r): int(s) for r, s in found}
        assert sorted(stopped) == [0, 1] and stopped[0] == stopped[1], log[-3000:]
        step = stopped[0]
        saved = run.events("CheckpointSaved")[-1]["data"]
        assert saved["step"] == step and saved["trigger"] == "signal"
        assert saved["world_size"] == 2
        latest = ck.latest_complete(run_dir / "checkpoints")
        assert latest is not None and latest.step == step
        names = {f.path for f in latest.files}
        assert {"rng-0.safetensors", "rng-1.safetensors", "dcp/.metadata"} <= names
        assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= names  # every rank wrote its shard
        stops.append(step)
    done = launcher.start(run_dir, *common, argv=argv)
    assert done.wait(600) == 0, done.tail()
    assert reference.wait(600) == 0, reference.tail()
    resumed = [e["data"]["step"] for e in done.events("RunResumed")]
    assert resumed == stops and len(set(stops)) == 3, (resumed, stops)
    logged = sorted(int(m["step"]) for m in launcher.read_jsonl(run_dir / "metrics.jsonl"))
    assert logged == list(range(1, steps + 1)), f"stops at {stops}: {logged}"
    a = launcher.weights(tmp_path / "reference" / "checkpoints" / f"checkpoint-{steps}")
    b = launcher.weights(run_dir / "checkpoints" / f"checkpoint-{steps}")
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert diff <= 1e-5, f"max abs difference {diff} after stops at {stops}"
