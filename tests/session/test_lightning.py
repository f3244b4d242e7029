"""A PyTorch Lightning script as Lightning's docs write it (LightningModule + ``Trainer.fit``), plus
``tgnb.train.protect(trainer)`` (tests/session/lightning_workdir/train.py): launched from a folder
of its own on the local engine and preempted twice, finishing with every step logged once; the
same script under a plain ``python`` with SIGTERM (exit 75, a sealed checkpoint, resumed by
running it again); and what `protect` refuses.

Everything is real: the emulator daemon over HTTP, the supervisor, Lightning and torch on the CPU,
signals.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.errors import TrainConfigError
from tgnb.session import Session
from tgnb.train.checkpoint import latest_complete

from ..train.checkpoint.conftest import worker_pids
from .test_user_code import FAST_DRAIN, _steps, preempt_twice

WORKDIR = Path(__file__).parent / "lightning_workdir"
MAX_STEPS = 600  # enough that the run still trains when the second preemption lands


def _workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "lit-project"
    shutil.copytree(WORKDIR, wd, ignore=shutil.ignore_patterns("__pycache__"))
    return wd


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_lightning_script_preempted_twice_loses_no_step(session: Session, tmp_path: Path) -> None:
    run = session.launch(
        "train.py",
        args=["--max-steps", str(MAX_STEPS)],
        workdir=_workdir(tmp_path),
        name="user-lightning",
        checkpoint=FAST_DRAIN,
    )
    preempt_twice(session, run)
    status = run.wait(timeout=600, progress=False)
    assert status.state.value == "succeeded", run.logs()[-30:]
    steps = _steps(run.records("metrics"))
    assert steps == list(range(1, MAX_STEPS + 1)), steps  # every step logged once
    summary = run.summary()
    assert summary["steps"] == MAX_STEPS
    assert summary["restarts"] == 2 and summary["preemptions"] == 2, summary
    assert summary["steps_lost"] <= 2, summary  # at most one step per preemption
    assert "lightning script: done" in run.logs()


@pytest.mark.slow
def test_a_lightning_script_outside_tgnb_exits_75_on_sigterm_and_resumes(tmp_path: Path) -> None:
    wd = _workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env["TGNB_HOME"] = str(tmp_path / "home")
    cmd = [sys.executable, "train.py", "--max-steps", "200"]
    proc = subprocess.Popen(cmd, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    metrics = wd / "out" / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, 300)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out.decode()[-2000:]
    assert b"run it again to resume" in out
    sealed = latest_complete(wd / "out" / "checkpoints")
    assert sealed is not None and sealed.meta.get("trigger") == "signal", sealed
    first = _steps(_rows(metrics))
    assert max(first) == sealed.step  # it stopped at the step it saved
    again = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    resumed = [e for e in _rows(wd / "out" / "events.jsonl") if e["reason"] == "RunResumed"]
    assert [e["data"]["step"] for e in resumed] == [sealed.step]  # type: ignore[index]
    assert _steps(_rows(metrics)) == list(range(1, 201))  # no step lost, none twice


def test_protect_takes_a_lightning_trainer_and_refuses_a_checkpoint_path(tmp_path: Path) -> None:
    import lightning as L

    import tgnb.train

    trainer = L.Trainer(max_steps=2, default_root_dir=str(tmp_path), logger=False)
    try:
        assert tgnb.train.protect(trainer) is trainer  # it raised AttributeError: 'args' before
        assert tgnb.train.protect(trainer) is trainer  # a second call changes nothing
        with pytest.raises(TrainConfigError, match="without ckpt_path"):
            trainer.fit(None, ckpt_path=str(tmp_path / "x.ckpt"))
    finally:
        trainer._tgnb_guard.close()  # give the signal handlers back
    with pytest.raises(TrainConfigError, match="Lightning Trainer"):
        tgnb.train.protect(object())
    import pytorch_lightning as pl  # the older package name: its own Callback class

    old = pl.Trainer(max_steps=2, default_root_dir=str(tmp_path / "pl"), logger=False)
    try:
        tgnb.train.protect(old)
        assert any(isinstance(cb, pl.Callback) and cb.state_key == "tgnb" for cb in old.callbacks)
    finally:
        old._tgnb_guard.close()


@pytest.mark.slow
def test_two_ddp_ranks_stop_at_one_step_and_resume_at_one_rank(tmp_path: Path) -> None:
    """The script under torchrun (``python -m tgnb.train.launch``, DDP, gloo on the CPU): SIGTERM
    to one rank stops both at the same step with a sealed checkpoint and exit 75 through the
    launcher; run again with one process, it resumes there (resharded) and ends with every
    step logged once."""
    wd = _workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env.update(TGNB_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    launch = [sys.executable, "-m", "tgnb.train.launch", "--standalone", "--nproc_per_node=2"]
    cmd = [*launch, "train.py", "--devices", "2", "--max-steps", "3000"]
    log = tmp_path / "ddp.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=wd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    metrics = wd / "out" / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5, 300)
        pids = wait_until(lambda: (p := worker_pids(proc.pid)) and len(p) == 2 and p, 300)
        os.kill(pids[1], signal.SIGTERM)
        assert proc.wait(timeout=300) == 75, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    at = {int(s) for s in re.findall(r"tgnb: rank \d preempted at step (\d+)", text)}
    assert len(at) == 1, text[-3000:]  # both ranks, one step
    sealed = latest_complete(wd / "out" / "checkpoints")
    assert sealed is not None and sealed.step == at.pop() and sealed.meta["world_size"] == 2
    again = subprocess.run(
        [sys.executable, "train.py", "--max-steps", "300"],
        cwd=wd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert _steps(_rows(metrics)) == list(range(1, 301))


@pytest.mark.slow
def test_a_lightning_run_resumed_mid_epoch_ends_bitwise_as_the_uninterrupted_one(
    tmp_path: Path,
) -> None:
    """SIGTERM at step 20 (the fifth of the 16 batches of the second epoch), resumed by running
    the script again: its parameters at step 24 equal bit for bit those of a run never stopped.
    The DataLoader shuffles (``shuffle=True``): the resumed epoch replays the order drawn at its
    start (`tgnb.train.lightning`; before, it drew another: max |diff| about 1e-3). Before the
    resume skipped the epoch's trained batches it trained on the epoch's first batches again
    (max |diff| about 6e-4)."""
    import torch

    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env.update(TGNB_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    params: list[dict[str, torch.Tensor]] = []
    for name, stops in (("once", ["--sigterm-at", "20"]), ("never", [])):
        wd = _workdir(tmp_path / name)
        cmd = [sys.executable, "train.py", "--max-steps", "24", "--shuffle", "--params", "p.pt"]
        for extra, code in ((stops, 75), ([], 0)) if stops else ((stops, 0),):
            done = subprocess.run([*cmd, *extra], cwd=wd, env=env, capture_output=True, text=True)
            assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
        params.append(torch.load(wd / "p.pt"))
    resumed, straight = params
    assert resumed.keys() == straight.keys()
    for key, value in straight.items():
        assert torch.equal(resumed[key], value), (key, (resumed[key] - value).abs().max())
