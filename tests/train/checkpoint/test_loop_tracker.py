"""The researcher's own tracker through `tgnb.train.Checkpointer` (``report_to=["wandb",
"mlflow"]``): the loop script (`loop_script.py`) stopped by SIGTERM twice and started again each
time, as an engine restarts a preempted run, keeps one W&B run and one MLflow run, with every
attempt's metrics and tgnb's preemption, checkpoint and resume events in them.

Real parts: a real MLflow tracking server over HTTP (``mlflow server``, SQLite), wandb in offline
mode (its files read back: W&B's servers cannot be reached here), real processes and signals."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tgnb.runs.node import Exit

from ...tracking import mlflow_server, wandb_runs
from .test_loop import Procs, finish, procs, steps, tail, wait_rows

__all__ = ["mlflow_server", "procs"]

STEPS = 24
FAKE_KEY = "wandb-fake-key-0123456789abcdef0123"  # never sent: offline; must never be written


def tracker_env(tmp_path: Path, mlflow_url: str) -> dict[str, str]:
    """What a researcher sets for their trackers (wandb offline: no W&B server here)."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wb"),
        "WANDB_SILENT": "true",
        "WANDB_API_KEY": FAKE_KEY,
        "WANDB_PROJECT": "tgnb-tests",
        "MLFLOW_TRACKING_URI": mlflow_url,
        "MLFLOW_EXPERIMENT_NAME": "tgnb-tests",
    }


def mlflow_history(url: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(url).get_metric_history(run_id, key)]


def one_mlflow_run(url: str) -> Any:
    """The one run of the tests' experiment on the server."""
    from mlflow import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name("tgnb-tests")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # one run, never one per attempt
    return runs[0]


def no_secret_in(run_dir: Path, *more: Path) -> None:
    for path in [*run_dir.rglob("*"), *more]:
        if path.is_file() and path.suffix in (".json", ".jsonl", ".yaml", ".log", ".txt", ""):
            assert FAKE_KEY not in path.read_text(errors="replace"), path


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_loop_preempted_twice_keeps_one_tracker_run_with_its_events(
    procs: Procs, tmp_path: Path, mlflow_server: str
) -> None:
    run_dir = tmp_path / "run"
    env = tracker_env(tmp_path, mlflow_server)
    args = (
        "--dir",
        str(run_dir),
        "--steps",
        str(STEPS),
        "--every",
        "100",
        "--sleep",
        "0.2",
        "--report-to",
        "wandb,mlflow",
    )
    for at in (4, 10):  # two preemptions, each once the attempt trained a few steps
        proc = procs.start(*args, env=env)
        wait_rows(proc, run_dir, at)
        os.kill(proc.pid, signal.SIGTERM)
        assert finish(proc) == Exit.PREEMPTED, tail(proc)
    last = procs.start(*args, env=env)
    assert finish(last) == 0, tail(last)
    assert sorted(set(steps(run_dir))) == list(range(1, STEPS + 1))

    state = json.loads((run_dir / "tracker.json").read_text())
    assert state["attempts"] == 3

    run = one_mlflow_run(mlflow_server)
    assert run.info.run_id == state["mlflow"]["run_id"] and run.info.status == "FINISHED"
    loss_steps = sorted(
        {s for s, _ in mlflow_history(mlflow_server, run.info.run_id, "train/loss")}
    )
    assert loss_steps == list(range(1, STEPS + 1))  # every attempt's rows, in the one run
    events = {
        key: mlflow_history(mlflow_server, run.info.run_id, f"tgnb/{key}")
        for key in ("RunStarted", "SignalReceived", "CheckpointSaved", "RunResumed", "RunExited")
    }
    assert [v for _, v in events["RunStarted"]] == [1, 2, 3]
    assert [v for _, v in events["SignalReceived"]] == [1, 2]
    assert [v for _, v in events["RunResumed"]] == [1, 2]
    resumed_at = [s for s, _ in events["RunResumed"]]
    assert [s for s, _ in events["SignalReceived"]] == resumed_at  # resumed where it stopped
    assert {s for s, _ in events["CheckpointSaved"]} >= {*resumed_at, STEPS}
    assert [v for _, v in events["RunExited"]] == [1, 2, 3]
    attempts = mlflow_history(mlflow_server, run.info.run_id, "tgnb/attempt")
    assert [v for _, v in attempts] == [1, 2, 3]

    wb = wandb_runs(tmp_path / "wb")
    assert len(wb) == 3  # W&B writes one offline directory per attempt...
    assert {r.run_id for r in wb} == {state["wandb"]["id"]}  # ...all of the one run
    assert {r.project for r in wb} == {"tgnb-tests"}
    assert [r.exit_code for r in wb] == [Exit.PREEMPTED, Exit.PREEMPTED, 0]
    rows = [row for r in wb for row in r.history]
    logged = sorted({int(row["train/global_step"]) for row in rows if "train/loss" in row})
    assert logged == list(range(1, STEPS + 1))
    for n, r in enumerate(wb):
        got = {k: v for row in r.history for k, v in row.items() if k.startswith("tgnb/")}
        assert got["tgnb/attempt"] == n + 1
        assert got["tgnb/RunExited"] == n + 1
        if n < 2:
            assert got["tgnb/SignalReceived"] == n + 1 and got["tgnb/CheckpointSaved"] >= n + 1
        if n:
            assert got["tgnb/RunResumed"] == n
    no_secret_in(run_dir, *(tmp_path / "wb").rglob("*.json"))
