"""The researcher's own tracker through `tgnb.train.protect`: the user's TRL SFT script
(``user_workdir/train.py``) with ``report_to=["wandb", "mlflow"]``, launched on the local engine
and preempted twice, keeps one W&B run and one MLflow run: Hugging Face's own ``WandbCallback`` and
``MLflowCallback`` log every attempt's metrics into the run tgnb opened (and resumed), and tgnb's
preemption, checkpoint and resume events are in it.

Real parts: the emulator over HTTP, the supervisor, TRL on the CPU, signals, a real MLflow tracking
server (``mlflow server``, SQLite). wandb runs offline (W&B's servers cannot be reached here): its
offline files are read back. The W&B key is a made-up one, passed by reference (``secrets=``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tgnb.runs.spec import SecretRef
from tgnb.session import Session
from tgnb.tasks import assets

from ..tracking import mlflow_server, wandb_runs
from ..train.checkpoint.test_loop_tracker import (
    FAKE_KEY,
    mlflow_history,
    no_secret_in,
    one_mlflow_run,
    tracker_env,
)
from .projects import user_workdir
from .test_user_code import FAST_DRAIN, MAX_STEPS, _steps, preempt_twice

__all__ = ["mlflow_server"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_protected_script_preempted_twice_keeps_one_tracker_run(
    session: Session, tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = tracker_env(tmp_path, mlflow_server)
    monkeypatch.setenv("WANDB_API_KEY", env.pop("WANDB_API_KEY"))
    wd = user_workdir(tmp_path)
    run = session.launch(
        "train.py",
        args=[
            "--model",
            assets.resolve_model("tiny"),
            "--max-steps",
            str(MAX_STEPS),
            "--report-to",
            "wandb,mlflow",
        ],
        workdir=wd,
        name="tracked-sft",
        checkpoint=FAST_DRAIN,
        env=env,
        secrets={"WANDB_API_KEY": SecretRef(name="wandb", env="WANDB_API_KEY")},
    )
    preempt_twice(session, run)
    status = run.wait(timeout=900, progress=False)
    assert status.state.value == "succeeded", run.logs()[-30:]
    assert _steps(run.records("metrics")) == list(range(1, MAX_STEPS + 1))
    run_dir = Path(run.run_dir or "")
    state = json.loads((run_dir / "tracker.json").read_text())
    assert state["attempts"] == 3

    found = one_mlflow_run(mlflow_server)
    run_id = found.info.run_id
    assert run_id == state["mlflow"]["run_id"] and found.info.status == "FINISHED"
    assert found.data.tags["tgnb.run"] == "tracked-sft"
    loss = sorted({s for s, _ in mlflow_history(mlflow_server, run_id, "loss")})
    assert loss == list(range(1, MAX_STEPS + 1))  # the Trainer's callback, every attempt
    resumed = mlflow_history(mlflow_server, run_id, "tgnb/RunResumed")
    assert [v for _, v in resumed] == [1, 2]
    exited = mlflow_history(mlflow_server, run_id, "tgnb/RunExited")
    assert [v for _, v in exited] == [1, 2, 3]
    assert [s for s, _ in exited][-1] == MAX_STEPS
    saved = {s for s, _ in mlflow_history(mlflow_server, run_id, "tgnb/CheckpointSaved")}
    assert {s for s, _ in resumed} <= saved  # each resume from a checkpoint the run logged
    notices = [
        s
        for key in ("tgnb/SignalReceived", "tgnb/DrainNoticeReceived")
        for s, _ in mlflow_history(mlflow_server, run_id, key)
    ]
    assert len(notices) >= 2  # each preemption's notice (a signal, a drain notice or both)
    attempts = mlflow_history(mlflow_server, run_id, "tgnb/attempt")
    assert [v for _, v in attempts] == [1, 2, 3]

    wb = wandb_runs(tmp_path / "wb")
    assert len(wb) == 3 and {r.run_id for r in wb} == {state["wandb"]["id"]}
    assert [r.exit_code for r in wb] == [75, 75, 0]
    rows = [row for r in wb for row in r.history]
    logged = sorted({int(row["train/global_step"]) for row in rows if "train/loss" in row})
    assert logged == list(range(1, MAX_STEPS + 1))  # WandbCallback's rows, in the one run
    for n, r in enumerate(wb):
        got = {k: v for row in r.history for k, v in row.items() if k.startswith("tgnb/")}
        assert got["tgnb/attempt"] == n + 1 and got["tgnb/RunExited"] == n + 1, got
        assert got.get("tgnb/RunResumed", 0) == n
    no_secret_in(run_dir, *(tmp_path / "wb").rglob("*.json"), *(tmp_path / "wb").rglob("*.log"))
    assert FAKE_KEY not in run.logs()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_built_in_run_with_report_to_keeps_one_tracker_run(
    session: Session, tmp_path: Path, mlflow_server: str
) -> None:
    """The built-in SFT run with ``trl: {report_to: [mlflow, wandb]}``, preempted once: one run in
    each tracker, the Trainer's metrics of both attempts and tgnb's resume in it."""
    env = tracker_env(tmp_path, mlflow_server)
    del env["WANDB_API_KEY"]
    steps = 40
    run = session.launch(
        "sft",
        name="builtin-tracked",
        max_steps=steps,
        trl={"report_to": ["mlflow", "wandb"]},
        checkpoint=FAST_DRAIN,
        env=env,
    )
    session.preempt(run=run)
    status = run.wait(timeout=900, progress=False)
    assert status.state.value == "succeeded", run.logs()[-30:]
    state = json.loads((Path(run.run_dir or "") / "tracker.json").read_text())
    assert state["attempts"] == 2

    found = one_mlflow_run(mlflow_server)
    run_id = found.info.run_id
    assert run_id == state["mlflow"]["run_id"] and found.info.status == "FINISHED"
    loss = sorted({s for s, _ in mlflow_history(mlflow_server, run_id, "loss")})
    assert loss == list(range(1, steps + 1))
    assert [v for _, v in mlflow_history(mlflow_server, run_id, "tgnb/RunResumed")] == [1]
    assert [v for _, v in mlflow_history(mlflow_server, run_id, "tgnb/RunExited")] == [1, 2]

    wb = wandb_runs(tmp_path / "wb")
    assert len(wb) == 2 and {r.run_id for r in wb} == {state["wandb"]["id"]}
    assert [r.exit_code for r in wb] == [75, 0]
