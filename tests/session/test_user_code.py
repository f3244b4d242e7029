"""The user's own code on the emulator: a TRL SFTTrainer script as TRL's own quickstart writes it,
plus ``tgnb.train.protect(trainer)`` (tests/session/user_workdir/train.py, importing a module of
its workdir), launched like a notebook launches it and preempted; the same script under a plain
``python`` with SIGTERM; a GRPO run reading its dataset and reward from the workdir; and what a
launch refuses before anything is recorded or sent.

Everything is real: the emulator daemon over HTTP, the supervisor, TRL on the CPU, signals. The
model is the built-in tiny one (no Hub here), passed to the script as a path as a user passes a
Hugging Face id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.session.projects import user_workdir
from tgnb.emulator.testing import EmulatorHandle
from tgnb.errors import TrainConfigError, ValidationError
from tgnb.events import parse_record, program_text
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.store import RunStore
from tgnb.session import Session
from tgnb.tasks import assets

FAST_DRAIN = {"drain_poll_seconds": 0.2}


def _steps(rows: list[dict[str, Any]]) -> list[int]:
    return sorted(int(r["step"]) for r in rows if "step" in r)


def preempt_twice(session: Session, run: Any) -> None:
    """`preempt_times` twice."""
    preempt_times(session, run, 2)


def preempt_times(session: Session, run: Any, times: int) -> None:
    """Preempt the run's node `times` times, each time once the attempt has trained 4 steps of
    its own, and wait for the run to be placed on another node."""
    rows = 0
    for _ in range(times):
        wait_until(
            lambda rows=rows: len(run.records("metrics")) >= rows + 4 and run.status.nodes, 300
        )
        node = run.status.nodes[0]
        session.preempt(node)
        wait_until(lambda node=node: run.status.nodes and run.status.nodes[0] != node, 300)
        rows = len(run.records("metrics"))


#: Steps enough that the run still trains when the second preemption lands: a fast machine ran all
#: 24 of an earlier version before it (and 21 steps in the first attempt alone: 4 steps, then the
#: notice's latency); 2 cores under load trained 13, then 22 in all before it. Each attempt is
#: preempted once it has logged 4 steps of its own, so 2 x 21 = 42 steps before the second
#: preemption is the fast machine's case; 100 leaves more than that again. Past that, steps only
#: add to the last attempt's time (the tracker test's steps each log to MLflow and W&B too).
MAX_STEPS = 100


@pytest.mark.slow
def test_a_protected_sft_script_preempted_twice_finishes(session: Session, tmp_path: Path) -> None:
    wd = user_workdir(tmp_path)
    model = assets.resolve_model("tiny")
    run = session.launch(
        "train.py",
        args=["--model", model, "--max-steps", str(MAX_STEPS)],
        workdir=wd,
        name="user-sft",
        checkpoint=FAST_DRAIN,
    )
    (wd / "prompts.py").write_text("raise ImportError('edited mid-run')\n")  # the snapshot runs
    preempt_twice(session, run)
    status = run.wait(timeout=600, progress=False)
    assert status.state.value == "succeeded", run.logs()[-30:]
    steps = _steps(run.records("metrics"))
    assert steps == list(range(1, MAX_STEPS + 1)), steps  # every step logged once
    summary = run.summary()
    assert summary["kind"] == "script" and summary["max_steps"] == MAX_STEPS
    assert summary["steps"] == MAX_STEPS
    assert summary["restarts"] == 2 and summary["preemptions"] == 2
    assert summary["steps_lost"] <= 2  # at most one step per preemption
    from tgnb.notebook.commands.runs import runs_table

    row = runs_table([run]).rows[0]  # what %tg runs shows
    assert tuple(row[:4]) == ("user-sft", "script", "succeeded", f"{MAX_STEPS}/{MAX_STEPS}"), row
    assert row[-2].startswith("$") and row[-1] == "", row  # its dollars; protected: no note
    logs = run.logs()
    assert "user script: done" in logs
    assert not any(line.lstrip().startswith("@tgnb") for line in logs)  # parsed, not printed
    assert (Path(run.run_dir or "") / "workdir" / "out" / "final").is_dir()


@pytest.mark.slow
def test_the_same_script_outside_tgnb_checkpoints_on_sigterm_and_resumes(tmp_path: Path) -> None:
    wd = user_workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env["TGNB_HOME"] = str(tmp_path / "home")
    cmd = [sys.executable, "train.py", "--model", assets.resolve_model("tiny"), "--max-steps", "40"]
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
    from tgnb.train.checkpoint import latest_complete

    sealed = latest_complete(wd / "out" / "checkpoints")
    assert sealed is not None and sealed.meta.get("trigger", "signal") == "signal", sealed
    first = _steps([json.loads(x) for x in metrics.read_text().splitlines()])
    again = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    events = [json.loads(x) for x in (wd / "out" / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e["reason"] == "RunResumed"]
    assert resumed and resumed[0]["data"]["step"] >= max(first) - 1
    assert max(_steps(rows)) == 40


@pytest.mark.slow
def test_grpo_with_a_relative_dataset_and_a_reward_of_the_workdir(
    session: Session, tmp_path: Path
) -> None:
    """The reward takes a dataset column (``answer``) as a named parameter, as TRL allows."""
    wd = tmp_path / "grpo-project"
    (wd / "data").mkdir(parents=True)
    with open(wd / "data" / "questions.jsonl", "w", encoding="utf-8") as fh:
        for i in range(64):
            a, b = i % 3, (i // 3) % 3
            fh.write(json.dumps({"prompt": f"What is {a}+{b}? Answer:", "answer": a + b}) + "\n")
    (wd / "my_rewards.py").write_text(
        "def exact(completions, answer, **kwargs):\n"
        "    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]\n"
    )
    run = session.launch(
        "grpo",
        workdir=wd,
        name="user-grpo",
        dataset="data/questions.jsonl",
        rewards=["my_rewards:exact"],
        max_steps=4,
    )
    status = run.wait(timeout=600, progress=False)
    assert status.state.value == "succeeded", run.logs()[-30:]
    assert _steps(run.records("metrics"))[-1] == 4
    assert "rewards/exact/mean" in run.records("metrics")[-1]


# -- refused at launch: nothing recorded, nothing sent ----------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    wd = user_workdir(tmp_path, rows=8)
    (wd / "rewards_ok.py").write_text("def r(completions, answer, **kw):\n    return [0.0]\n")
    (wd / "rewards_bad.py").write_text("def r(completions, colour):\n    return [0.0]\n")
    (wd / "broken.py").write_text("def f(:\n")
    (wd / "q.jsonl").write_text(json.dumps({"prompt": "p", "answer": 1}) + "\n")
    (wd / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "a"}) + "\n")
    return wd


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("missing-dataset", {"what": "grpo", "dataset": "data/nope.jsonl"}, "does not exist"),
    ("dpo-columns", {"what": "dpo", "dataset": "pairs.jsonl"}, "prompt+chosen+rejected"),
    ("reward-module", {"what": "grpo", "dataset": "q.jsonl", "rewards": ["nomod:r"]}, "nomod"),
    (
        "reward-param",
        {"what": "grpo", "dataset": "q.jsonl", "rewards": ["rewards_bad:r"]},
        "colour",
    ),
    ("trl-typo", {"what": "grpo", "trl": {"learning_rte": 0.1}}, "Did you mean 'learning_rate'"),
    ("lr-negative", {"what": "grpo", "trl": {"learning_rate": -1}}, "trl.learning_rate"),
    ("lr-huge", {"what": "grpo", "trl": {"learning_rate": 1e308}}, "trl.learning_rate"),
    ("no-script", {"what": "nosuch.py"}, "is not in the workdir"),
    ("syntax", {"what": "broken.py"}, "does not compile"),
    ("reserved-env", {"what": "train.py", "env": {"TGNB_RUN_DIR": "/x"}}, "set by tgnb"),
    ("nul-env", {"what": "train.py", "env": {"A": "x\x00y"}}, "control character"),
    ("outside", {"what": "/etc/hostname.py"}, "inside the workdir"),
    ("args-no-script", {"what": "grpo", "args": ["--x"]}, "go with a script"),
    ("script-max-steps", {"what": "train.py", "max_steps": 5}, "does not apply to a script"),
    ("script-trl", {"what": "train.py", "trl": {"bf16": True}}, "does not apply to a script"),
]


def test_launch_refuses_before_anything_is_recorded_or_sent(
    session: Session, emu: EmulatorHandle, tmp_path: Path, project: Path
) -> None:
    """Every case of `REFUSED` on one session (a session per case costs 15 s each here)."""
    before = RunStore(tmp_path).list()
    emu.clear_requests()
    for case, kw, expected in REFUSED:
        kw = dict(kw)
        what = kw.pop("what")
        if not what.endswith(".py"):  # a script is given its steps as an argument
            kw.setdefault("max_steps", 5)
        with pytest.raises(ValidationError) as info:
            session.launch(what, workdir=project, name=f"bad-{case}", **kw)
        message = str(info.value)
        assert expected in message and "\n" not in message, (case, message)
        if case in ("trl-typo", "reward-module", "reward-param"):
            assert isinstance(info.value, TrainConfigError), case
        assert not (tmp_path / "runs" / f"bad-{case}").exists(), case
    assert [r for r in emu.requests() if r["method"] not in ("GET", "HEAD")] == []
    assert RunStore(tmp_path).list() == before


def test_env_reaches_the_script_and_a_failure_shows_its_line(
    session: Session, tmp_path: Path
) -> None:
    """PYTHONPATH in env applies (the run starts cold, not forked from the warm supervisor), and
    a failing script's status is its exception line, not an exit code."""
    wd = tmp_path / "plain"
    wd.mkdir()
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("VALUE = 'from PYTHONPATH'\n")
    (wd / "ok.py").write_text(
        "import os, sys, helper_mod\n"
        "print('helper:', helper_mod.VALUE, 'args:', sys.argv[1:], 'run:', os.environ['TGNB_RUN'])\n"
    )
    (wd / "fails.py").write_text("raise ValueError('the learning rate table is empty')\n")
    ok = session.launch("ok.py", args=["--x", "1"], workdir=wd, name="plain-ok",
                        env={"PYTHONPATH": str(lib)})  # fmt: skip
    # both run at once; the failing one is restarted once, after a short wait (the default: 3
    # restarts after 5, 10, 20 s: 35 s of sleeping here); the detail survives the restart
    bad = session.launch("fails.py", workdir=wd, name="plain-fails",
                         recovery=RecoveryPolicy(max_restarts=1, backoff_s=0.2))  # fmt: skip
    assert ok.wait(timeout=300, progress=False).state.value == "succeeded", ok.logs()
    assert "helper: from PYTHONPATH args: ['--x', '1'] run: plain-ok" in ok.logs()
    status = bad.wait(timeout=300, progress=False)
    assert status.state.value == "failed"
    assert status.detail == "ValueError: the learning rate table is empty"
    assert bad.error() == status.detail


def test_protocol_lines_are_parsed_not_printed() -> None:
    record = '@tgnb {"kind": "metrics", "step": 3}'
    assert program_text(record) is None
    assert parse_record(record) == {"kind": "metrics", "step": 3}
    bar = "100%|#####| 30/30 [00:42<00:00]" + record  # a progress bar ends with \r, no newline
    assert program_text(bar) == "100%|#####| 30/30 [00:42<00:00]"
    assert parse_record(bar) == {"kind": "metrics", "step": 3}
    assert program_text("plain output") == "plain output"
