"""Two processes under ``torchrun --nproc_per_node=2`` (gloo on the CPU), tiny DPO through the real
``python -m tgnb.train``: a SIGTERM to rank 1 only makes both ranks checkpoint at the same step and
exit with EXIT_PREEMPTED; only rank 0 writes events and the marker; a second torchrun resumes
both ranks from that checkpoint and finishes. Timeouts guard against deadlocks."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def worker_pids(parent: int) -> dict[int, int]:
    """``{rank: pid}`` of torchrun's worker processes (children of its agent)."""
    out: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = int(stat.parent.name)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_to_one_rank_stops_all_ranks_at_the_same_step(
    launcher: Any, tmp_path: Path
) -> None:
    run_dir = tmp_path / "ddp"
    from tgnb.train import assets

    # Build the tiny model once up front: two ranks building it at once can collide
    # (assets.tiny_path's rename race, reported to its owner).
    assets.tiny_path(0, tmp_path / "home" / "assets")
    argv = [*TORCHRUN, "-m", "tgnb.train"]
    common = ("algorithm=dpo", "model=tiny", "checkpoint.watch_drain=false")
    run = launcher.start(run_dir, "max_steps=200", *common, argv=argv)
    run.wait_step(3, timeout=600)
    deadline = time.monotonic() + 60
    while len(pids := worker_pids(run.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGTERM)
    run.wait(300)  # torchrun itself reports its workers' non-zero exit as a failure
    log = run.tail(200_000)
    stopped = {
        int(r): int(s) for r, s in re.findall(r"tgnb: rank (\d) preempted at step (\d+)", log)
    }
    assert sorted(stopped) == [0, 1], log[-3000:]
    assert stopped[0] == stopped[1], stopped
    step = stopped[0]
    assert re.search(rf"exitcode\s*:\s*{EXIT_PREEMPTED}", log), log[-3000:]

    events = run.events()
    saved = [e["data"] for e in events if e["reason"] == "CheckpointSaved"]
    assert [s["step"] for s in saved] == [step] and saved[0]["trigger"] == "signal"
    assert [e["data"]["step"] for e in events if e["reason"] == "SignalReceived"] == [step]
    assert [e["data"]["exit_code"] for e in events if e["reason"] == "RunExited"] == [75]
    latest = ck.latest_complete(run_dir / "checkpoints")
    assert latest is not None and latest.step == step
    names = {f.path for f in latest.files}
    assert {"rng-0.safetensors", "rng-1.safetensors", "dcp/.metadata", "optimizer.json"} <= names
    assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= names  # every rank wrote its shard

    again = launcher.start(run_dir, f"max_steps={step + 2}", *common, argv=argv)
    assert again.wait(600) == 0, again.tail()
    resumed = [e["data"] for e in again.events("RunResumed")]
    assert [r["step"] for r in resumed] == [step]
    log = again.tail(200_000)
    assert sorted(re.findall(r"tgnb: rank (\d) finished at step (\d+)", log)) == [
        ("0", str(step + 2)),
        ("1", str(step + 2)),
    ]
