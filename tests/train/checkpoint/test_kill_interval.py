"""A kill with no notice loses at most the interval announced before it: a user's plain PyTorch loop
with the `Checkpointer` (as docs/own-code.md writes it, from a folder of its own, under the default
policy: ``auto``), SIGKILLed at a random step, then run again. The steps redone are counted from the
program's own printed log and compared with the last ``CheckpointIntervalChosen`` of its
``events.jsonl`` before the kill. Real torch, real saves, a real SIGKILL: nothing faked."""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tgnb.events import parse_time
from tgnb.runs.node import CHECKPOINT_ENV, RUN_DIR_ENV

from .conftest import read_jsonl

PROGRAM = """\
import argparse
import time

import torch

import tgnb.train

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=100_000)
parser.add_argument("--step-s", type=float, default=0.05)  # the rest of a real step's time
args = parser.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100)

ckpt = tgnb.train.Checkpointer(model, opt, sched, max_steps=args.max_steps, dir="out")
for step in ckpt.steps():  # from the saved step + 1
    x = torch.randn(32, 256)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    ckpt.log(loss=loss)
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(args.step_s)
"""
STEP = re.compile(r"^step (\d+) loss ", re.M)


def start(prog: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in (RUN_DIR_ENV, CHECKPOINT_ENV, "TGNB_RUN", "TGNB_NOTICE_FILE", "SLURM_JOB_ID"):
        env.pop(name, None)
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=prog,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def printed(log: Path) -> list[int]:
    """The steps the program printed (its own log)."""
    return [int(s) for s in STEP.findall(log.read_text(errors="replace"))]


def announced(out: Path) -> list[dict[str, Any]]:
    return [
        e for e in read_jsonl(out / "events.jsonl") if e["reason"] == "CheckpointIntervalChosen"
    ]


def wait(what: str, ready: Callable[[], Any], proc: Any, log: Path, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := ready():
            return got
        assert proc.poll() is None, f"exited {proc.returncode} before {what}:\n{log.read_text()}"
        time.sleep(0.02)
    raise AssertionError(f"no {what} in {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_kill_with_no_notice_loses_at_most_the_interval_announced_before_it(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "train.py").write_text(PROGRAM)
    out = prog / "out"
    log = tmp_path / "first.log"
    first = start(prog, log)
    try:  # the interval once a save was measured (the first is from a guessed stall)
        measured = wait("interval from a measured save", lambda: [
            e for e in announced(out) if e["data"].get("stall_measured")], first, log)  # fmt: skip
        every, since = measured[0]["data"]["every_steps"], measured[0]["data"]["step"]
        target = since + rng.randint(1, 2 * every)  # within the next two intervals
        wait(f"step {target}", lambda: (printed(log) or [0])[-1] >= target, first, log, 900)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    killed = time.time()
    last = printed(log)[-1]
    told = [e for e in announced(out) if parse_time(e["time"]).timestamp() <= killed][-1]
    again = tmp_path / "again.log"
    second = start(prog, again, "--max-steps", str(last + 2))
    assert second.wait(timeout=300) == 0, again.read_text()
    resumed = [e["data"]["step"] for e in read_jsonl(out / "events.jsonl")
               if e["reason"] == "RunResumed"]  # fmt: skip
    assert len(resumed) == 1 and printed(again)[0] == resumed[0] + 1, again.read_text()
    redone = last - resumed[0]
    lines = [e["message"] for e in announced(out)]
    said = f"seed {seed}: killed after step {last}, resumed at {resumed[0]}; announced: {lines}"
    print(said)
    assert 0 <= redone <= told["data"]["every_steps"] + 1, said
    # each periodic save came at most an interval in force since the one before after it
    saves = [0] + [e["data"]["step"] for e in read_jsonl(out / "events.jsonl")
                   if e["reason"] == "CheckpointSaved" and e["data"]["trigger"] == "periodic"]  # fmt: skip
    told_at = [(e["data"]["step"], e["data"]["every_steps"]) for e in announced(out)]
    for a, b in itertools.pairwise(saves):
        since = [n for s, n in told_at if s <= a][-1:] + [n for s, n in told_at if a < s <= b]
        assert since and b - a <= max(since), (a, b, said)
    assert any(e["data"]["stall_measured"] for e in announced(out))
