"""SIGTERM mid-run, restart, resume: through the real ``python -m tgnb.train`` on the tiny assets.

- DPO: a run interrupted by 3 SIGTERMs (each restart resumes from the checkpoint of the last step
  boundary before the signal) ends with the same weights as an uninterrupted run with the
  same seed (max abs difference <= 1e-6).
- GRPO: a run interrupted the same way performs exactly max_steps optimizer steps, none repeated
  or skipped (the logged steps over all its processes are 1..max_steps, each once).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck


def interrupted(launcher: Any, run_dir: Path, max_steps: int, *overrides: str) -> list[int]:
    """Run to `max_steps` with 3 SIGTERMs; check each stop and resume; return the stop steps."""
    stops: list[int] = []
    resume_step = 0
    for i in range(4):
        run = launcher.start(run_dir, f"max_steps={max_steps}", *overrides)
        if i == 3:
            assert run.wait(600) == 0, run.tail()
            break
        run.wait_step(resume_step + 3, timeout=600)
        run.signal(signal.SIGTERM)
        assert run.wait(300) == EXIT_PREEMPTED, run.tail()
        exited = run.events("RunExited")[-1]["data"]
        saved = run.events("CheckpointSaved")[-1]["data"]
        got = run.events("SignalReceived")[-1]["data"]
        # The checkpoint is of the last step boundary before the signal (written then, or already
        # there from a periodic save of that step); the step in progress was abandoned, unlogged.
        assert saved["trigger"] in ("signal", "periodic") and got["signal"] == "SIGTERM"
        assert exited["exit_reason"] == "preempted" and exited["exit_code"] == EXIT_PREEMPTED
        assert saved["step"] == exited["step"] == got["step"] == max(run.steps())
        latest = ck.latest_complete(run_dir / "checkpoints")
        assert latest is not None and latest.step == saved["step"]
        assert saved["bytes"] == latest.bytes and saved["duration_s"] > 0
        resume_step = latest.step
        stops.append(resume_step)
    resumed = [e["data"] for e in run.events("RunResumed")]
    assert [r["step"] for r in resumed] == stops
    assert [r["restart_count"] for r in resumed] == [1, 2, 3]
    assert len(set(stops)) == 3 and stops[-1] < max_steps
    return stops


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dpo_interrupted_three_times_ends_with_the_same_weights(
    launcher: Any, tmp_path: Path
) -> None:
    steps = 30
    common = ("algorithm=dpo", "model=tiny", "seed=3", "checkpoint.every_steps=7")
    common += ("dataset_size=256",)  # 32 batches of 8: the 30 steps in one epoch, less to tokenize
    reference = launcher.start(tmp_path / "reference", f"max_steps={steps}", *common)
    stops = interrupted(launcher, tmp_path / "interrupted", steps, *common)
    assert reference.wait(600) == 0, reference.tail()
    a = launcher.weights(tmp_path / "reference" / "checkpoints" / f"checkpoint-{steps}")
    b = launcher.weights(tmp_path / "interrupted" / "checkpoints" / f"checkpoint-{steps}")
    assert a.keys() == b.keys()
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert diff <= 1e-6, f"max abs difference {diff} after stops at {stops}"
    # The weights did change: the comparison is not between two untouched models.
    (initial,) = (tmp_path / "home" / "assets").glob("tiny-3-*")
    init = launcher.weights(initial)
    assert max(float((a[k] - init[k]).abs().max()) for k in a) > 1e-4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_interrupted_three_times_steps_each_step_once(launcher: Any, tmp_path: Path) -> None:
    steps = 24
    run_dir = tmp_path / "grpo"
    stops = interrupted(
        launcher,
        run_dir,
        steps,
        "algorithm=grpo",
        "model=tiny",
        "checkpoint.every_steps=5",
        "trl.per_device_train_batch_size=16",
    )
    logged = [int(m["step"]) for m in launcher.read_jsonl(run_dir / "metrics.jsonl")]
    assert sorted(logged) == list(range(1, steps + 1)), f"stops at {stops}: {logged}"
    saved = [
        e["data"]["step"]
        for e in launcher.read_jsonl(run_dir / "events.jsonl")
        if e["reason"] == "CheckpointSaved"
    ]
    assert set(stops) <= set(saved) and saved[-1] == steps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_lora_interrupted_three_times_saves_the_adapter_only(launcher: Any, tmp_path: Path) -> None:
    """A PEFT LoRA run: its checkpoints hold the adapter and its optimizer state only (DCP with
    ``ignore_frozen_params``), and a run interrupted 3 times steps each step once."""
    from tgnb.train.dcpio import SafeReader

    steps = 20
    run_dir = tmp_path / "lora"
    lora = ("lora.r=4", "lora.lora_alpha=8", "checkpoint.every_steps=4")
    lora += ("dataset_size=256",)  # 32 batches of 8: the 20 steps in one epoch, less to tokenize
    stops = interrupted(launcher, run_dir, steps, "algorithm=dpo", "model=tiny", *lora)
    logged = [int(m["step"]) for m in launcher.read_jsonl(run_dir / "metrics.jsonl")]
    assert sorted(logged) == list(range(1, steps + 1)), f"stops at {stops}: {logged}"
    final = run_dir / "checkpoints" / f"checkpoint-{steps}"
    assert (final / "adapter_model.safetensors").is_file()
    saved = SafeReader(final / "dcp").read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), model_keys
