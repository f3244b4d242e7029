"""A run whose directory is on a small tmpfs (2 MiB: the tiny DPO model's checkpoint is about
1.3 MB) through the real ``python -m tgnb.train``: the disk fills up while checkpointing; the run
reports it (``CheckpointFailed`` naming the disk, a log line), keeps its last complete checkpoint,
and exits 74 (`EXIT_NO_SPACE`), not 1; a later resume from it works once there is room."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tgnb.train import checkpoint as ck
from tgnb.train.saving import EXIT_NO_SPACE


@pytest.mark.timeout(600)
def test_a_run_on_a_full_disk_exits_74_and_keeps_its_last_checkpoint(
    launcher: Any, small_disk: Path, tmp_path: Path
) -> None:
    run_dir = small_disk / "run"
    common = ("algorithm=dpo", "model=tiny", "checkpoint.watch_drain=false")
    run = launcher.start(run_dir, "max_steps=50", "checkpoint.every_steps=1", *common)
    assert run.wait(300) == EXIT_NO_SPACE, run.tail()
    log = run.tail(20_000)  # the checkpoint's or the metrics' write hit it first: either names it
    assert "disk full" in log and str(run_dir) in log, log
    latest = ck.latest_complete(run_dir / "checkpoints")
    assert latest is not None, run.tail()
    # the room comes back: the run resumes from exactly that checkpoint
    roomy = tmp_path / "roomy"
    shutil.copytree(run_dir, roomy)
    again = launcher.start(roomy, f"max_steps={latest.step + 2}", *common)
    assert again.wait(300) == 0, again.tail()
    assert [e["data"]["step"] for e in again.events("RunResumed")] == [latest.step]
