"""Real training runs through ``python -m tgnb.train`` (and ``tgnb train``) on the CPU with TRL
and the built-in tiny model: what a run leaves, the exit codes, resume after SIGTERM, and the
learning test. Nothing is faked."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import EXIT_PREEMPTED

GRPO_FIELDS = {
    "step",
    "time",
    "loss",
    "reward",
    "reward_std",
    "learning_rate",
    "tokens_per_second",
    "rewards/correctness/mean",
    "rewards/format/mean",
}
DPO_FIELDS = {
    "step",
    "time",
    "loss",
    "learning_rate",
    "tokens_per_second",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
}


def reasons(run_dir: Path) -> list[str]:
    from tgnb.events import read_jsonl

    return [ev.reason for ev in read_jsonl(run_dir / "events.jsonl")]


def check_stdout(stdout: str, stdout_records: Any, run_dir: Path) -> None:
    records = stdout_records(stdout)
    files = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "metrics"] == [r["step"] for r in files]
    assert [r["reason"] for r in records if r["kind"] == "events"] == [e["reason"] for e in events]


@pytest.mark.slow
def test_grpo_run_with_lora_leaves_its_files(
    tmp_path: Path, train: Any, rows: Any, stdout_records: Any
) -> None:
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(
        "algorithm: grpo\nmodel: tiny\nmax_steps: 3\n"
        "lora: {r: 4, lora_alpha: 8, target_modules: [q_proj, v_proj]}\n"
        "trl: {per_device_train_batch_size: 16}\n"
    )
    run_dir = tmp_path / "run"
    proc = train([str(cfg), "--set", "seed=1", "--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = (run_dir / "run.yaml").read_text()
    assert "seed: 1" in saved and "lora_alpha: 8" in saved
    metrics = rows(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert set(m) >= GRPO_FIELDS, GRPO_FIELDS - set(m)
    evs = reasons(run_dir)  # periodic saves (checkpoint.auto, the default) may come between
    assert evs[0] == "RunStarted" and evs[-2:] == ["CheckpointSaved", "RunExited"], evs
    check_stdout(proc.stdout, stdout_records, run_dir)
    ckpt = run_dir / "checkpoints" / "checkpoint-3"
    assert (ckpt / "adapter_model.safetensors").is_file()  # LoRA: the adapter is what is saved


@pytest.mark.slow
def test_dpo_run_through_tgnb_console_script(
    tmp_path: Path, rows: Any, stdout_records: Any
) -> None:
    run_dir = tmp_path / "dpo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tgnb.cli",
            "train",
            "--set",
            "algorithm=dpo",
            "--set",
            "max_steps=4",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = rows(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert set(m) >= DPO_FIELDS, DPO_FIELDS - set(m)
    evs = reasons(run_dir)  # periodic saves (checkpoint.auto, the default) may come between
    assert evs[0] == "RunStarted" and evs[-2:] == ["CheckpointSaved", "RunExited"], evs
    exited = rows(run_dir / "events.jsonl")[-1]
    assert exited["data"]["exit_code"] == 0 and exited["data"]["exit_reason"] == "finished"
    check_stdout(proc.stdout, stdout_records, run_dir)
    assert "algorithm: dpo" in (run_dir / "run.yaml").read_text()


@pytest.mark.slow
def test_sigterm_exits_preempted_then_resumes(tmp_path: Path, train: Any, rows: Any) -> None:
    """SIGTERM mid-run: exit 75 with a checkpoint; the restart resumes from it and finishes;
    asking for no more steps than the checkpoint holds is then a one-line config error."""
    from tgnb.events import STDOUT_PREFIX

    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tgnb.train",
            "--set",
            "max_steps=5000",
            "--set",
            "checkpoint.watch_drain=false",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until training has taken a few steps
            if (
                line.startswith(STDOUT_PREFIX)
                and json.loads(line[len(STDOUT_PREFIX) :]).get("step") == 3
            ):
                break
        proc.send_signal(signal.SIGTERM)
        proc.stdout.read()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == EXIT_PREEMPTED
    events = rows(run_dir / "events.jsonl")
    assert [e["reason"] for e in events][-3:] == ["SignalReceived", "CheckpointSaved", "RunExited"]
    step = events[-1]["data"]["checkpoint_step"]
    assert events[-1]["data"]["exit_code"] == EXIT_PREEMPTED and 3 <= step < 5000

    done = train(["--set", f"max_steps={step + 2}", "--run-dir", str(run_dir)])
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = [e for e in rows(run_dir / "events.jsonl") if e["reason"] == "RunResumed"]
    assert len(resumed) == 1 and resumed[0]["data"]["step"] == step
    steps = [m["step"] for m in rows(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, step + 3))  # none repeated, none skipped

    again = train(["--set", f"max_steps={step + 2}", "--run-dir", str(run_dir)])
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "Traceback" not in again.stderr
    assert f"is not above step {step + 2}" in again.stderr


def test_bad_config_exit_code_and_one_line(tmp_path: Path, train: Any) -> None:
    proc = train(["--set", "algorithm=ppo", "--run-dir", str(tmp_path / "r")])
    assert proc.returncode == 2
    assert proc.stderr.strip() == "tgnb train: unknown algorithm 'ppo'. Did you mean 'dpo'?"
    assert not (tmp_path / "r").exists()  # nothing written for a bad config


@pytest.mark.slow
def test_builtin_grpo_task_learns(tmp_path: Path) -> None:
    """The learning test: on the built-in task the mean reward over the last 10 of 100 steps is
    clearly above the first 10 (seeded), and the correctness part rises, not only the format."""
    from tgnb.tasks import config
    from tgnb.train import runner

    cfg = config.load(
        None, ["max_steps=100", "checkpoint.watch_drain=false"], run_dir=tmp_path / "learn"
    )
    assert runner.run(cfg) == 0
    metrics = [
        json.loads(x) for x in (tmp_path / "learn" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(metrics) == 100
    reward = [m["reward"] for m in metrics]
    correct = [m["rewards/correctness/mean"] for m in metrics]
    first, last = statistics.mean(reward[:10]), statistics.mean(reward[-10:])
    print(
        f"mean reward first 10 steps {first:.3f}, last 10 steps {last:.3f}; correctness "
        f"{statistics.mean(correct[:10]):.3f} -> {statistics.mean(correct[-10:]):.3f}"
    )
    assert last > first + 0.2
    assert statistics.mean(correct[-10:]) > statistics.mean(correct[:10]) + 0.12
