"""SIGKILL at seeded random instants during checkpoint saves; every resume loads a complete one.

24 trials chained in one run directory. Each trial is a child process (forked from `zygote.py`, which
imported torch and TRL once) that resumes through the real `CheckpointGuard` and trains the tiny
model with DPO. Half of them save at every step (the Trainer's layout) and are SIGKILLed at a seeded
random instant inside (or just after) a save; the other half are sent SIGTERM mid-step and SIGKILLed
inside (or just after) the express checkpoint it starts. After each kill this test checks on its own
that the newest complete checkpoint really loads (safetensors, optimizer, scheduler, RNG, trainer
state at the marker's step; an express one once written out as the resume does), and that the next
trial resumed from exactly that one. An express checkpoint is written and sealed in the spare,
then renamed: cut short, it is torn there (blank marker); killed after its seal and before the
rename, it is complete there, and the next trial names it and resumes from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from tgnb.train import checkpoint as ck
from tgnb.train import express

HERE = Path(__file__).parent
TRIALS = 24


def answer(stream: IO[str]) -> dict[str, Any]:
    """The zygote's next protocol line (it shares stdout with the runs' own records)."""
    for line in stream:
        if line.startswith("ZYGOTE "):
            return dict(json.loads(line[len("ZYGOTE ") :]))
    raise AssertionError("the zygote died")


def load_all(ckpt: ck.Checkpoint, scratch: Path) -> int:
    """Load every part of a checkpoint as the Trainer would (an express one once written out in
    the Trainer's layout, as the resume does); returns the trainer state's step."""
    import torch
    from safetensors.torch import load_file

    path = express.expand(ckpt.path, scratch) if express.is_express(ckpt.path) else ckpt.path
    load_file(str(path / "model.safetensors"))
    torch.load(path / "optimizer.pt", weights_only=True)
    torch.load(path / "scheduler.pt", weights_only=True)
    torch.load(path / "rng_state.pth", weights_only=False)
    state = json.loads((path / "trainer_state.json").read_text())
    return int(state["global_step"])


def spare_torn(ckpt_dir: Path) -> bool:
    """Whether the spare holds an express checkpoint cut short: its file, allocated as zeros, was
    written into, and its marker is still blank (torn: never listed, overwritten by the next)."""
    spare = ckpt_dir / express.SPARE
    try:
        written = bool((spare / express.STATE_FILE).read_bytes().strip(b"\0"))
    except OSError:
        return False
    return written and ck.read_marker(spare) is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_during_saves_never_yields_a_torn_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TGNB_HOME": str(tmp_path / "home")}
    env.pop("TGNB_NOTICE_FILE", None)
    zygote = subprocess.Popen(
        [sys.executable, str(HERE / "zygote.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    torn_after_kill = torn_express = express_done = staged = 0
    expected_resume: int | None = None
    try:
        assert answer(zygote.stdout) == {"ready": True}
        for i in range(TRIALS):
            report = tmp_path / f"trial-{i}.json"
            zygote.stdin.write(f"{run_dir} {1000 + i} {report}\n")
            zygote.stdin.flush()
            status = answer(zygote.stdout)["status"]
            error = report.with_suffix(".error")
            assert not error.exists(), error.read_text()
            info = json.loads(report.read_text())
            assert "error" not in info, info
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, info
            # The trial resumed from exactly the checkpoint this test found complete last time.
            assert info["resumed_step"] == expected_resume, (i, info)

            dirs = ck.checkpoint_dirs(run_dir / "checkpoints")
            torn = [d for d in dirs if ck.verify(d) is None]
            cut = spare_torn(run_dir / "checkpoints")
            torn_after_kill += bool(torn) or cut
            latest = ck.latest_complete(run_dir / "checkpoints")
            assert latest is not None, f"trial {i}: no complete checkpoint left"
            assert load_all(latest, tmp_path / "expanded") == latest.step
            if info["mode"] == "periodic":
                assert latest.step >= info["armed_step"] - 1, (i, info, latest.step)
            else:  # the last one, or the express checkpoint of the step preempted (or the next)
                assert latest.step == expected_resume or latest.step >= info["armed_step"]
                assert latest.step <= info["armed_step"] + 1, (i, info, latest.step)
                express_done += express.is_express(latest.path)
                staged += latest.path.name == ck.STAGING  # sealed, killed before its rename
                # torn: the express checkpoint itself (not an older one being rotated away)
                torn_express += cut or any(ck.listed_step(d) >= info["armed_step"] for d in torn)
            expected_resume = latest.step
    finally:
        zygote.stdin.close()
        try:
            zygote.wait(timeout=60)
        except subprocess.TimeoutExpired:
            zygote.kill()
            zygote.wait()
    print(
        f"{torn_after_kill} of {TRIALS} kills left a torn checkpoint ({torn_express} of the "
        f"{TRIALS // 2} express trials inside the express save; {express_done} completed one, "
        f"{staged} of them killed before its rename); "
        f"last step {expected_resume}"
    )
    # The kills must really have landed inside saves, or this test would prove nothing.
    assert torn_after_kill >= TRIALS // 4, f"only {torn_after_kill} kills left a torn checkpoint"
    assert torn_express >= 1, "no kill landed inside an express checkpoint"
