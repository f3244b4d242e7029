"""A run whose directory is on a small tmpfs (2 MiB: the tiny DPO model's checkpoint is about
1.3 MB) through the real ``python -m tgnb.train``: the disk fills up while checkpointing; the run
reports it (``CheckpointFailed`` naming the disk, a log line), keeps its last complete checkpoint,
and exits 74 (`Exit.NO_SPACE`), not 1; a later resume from it works once there is room."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.runs.node import Exit
from tgnb.train import checkpoint as ck

from .conftest import read_jsonl


@pytest.mark.timeout(600)
def test_a_run_on_a_full_disk_exits_74_and_keeps_its_last_checkpoint(
    launcher: Any, small_disk: Path, tmp_path: Path
) -> None:
    run_dir = small_disk / "run"
    common = ("algorithm=dpo", "model=tiny", "checkpoint.watch_drain=false")
    run = launcher.start(run_dir, "max_steps=50", "checkpoint.every_steps=1", *common)
    assert run.wait(300) == Exit.NO_SPACE, run.tail()
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


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("save", ["final", "preemption"])
def test_a_full_disk_in_a_synchronous_save_is_disk_full_and_exit_74(
    launcher: Any, small_disk: Path, tmp_path: Path, save: str
) -> None:
    """A synchronous save (the final one; a preemption's, on SIGTERM) on a full disk: DCP's
    `CheckpointException` is a `BaseException`, which was a bare traceback and exit 1. Now "disk
    full" and 74, the checkpoint resumed from kept."""
    common = (
        "algorithm=dpo",
        "model=tiny",
        "checkpoint.watch_drain=false",
        "checkpoint.auto=false",
    )
    roomy = tmp_path / "roomy"
    first = launcher.start(roomy, "max_steps=2", *common)
    assert first.wait(300) == 0, first.tail()
    run_dir = small_disk / "run"
    shutil.copytree(roomy, run_dir)  # 1.7 MB of the 2 MB
    room = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * max(0, room - 256 * 1024))  # a save needs 1.2 MB
    again = launcher.start(run_dir, f"max_steps={4 if save == 'final' else 10_000}", *common)
    if save == "preemption":
        wait_until(lambda: any(r["step"] > 2 for r in read_jsonl(run_dir / "metrics.jsonl")), 120)
        again.signal()
    code = again.wait(300)
    log = again.tail(20_000)
    assert code == Exit.NO_SPACE, log
    assert "disk full" in log and "Traceback" not in log, log
    latest = ck.latest_complete(run_dir / "checkpoints")
    assert latest is not None and latest.step == 2, log
    assert [e["data"]["step"] for e in again.events("RunResumed")] == [2]
