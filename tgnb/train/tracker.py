"""The researcher's own tracker (Weights & Biases, MLflow): one tracker run per tgnb run, across
preemptions and restarts, with the run's preemptions, checkpoints and resumes logged as events.

`open_trackers` opens, on rank 0, the tracker runs that ``report_to`` names (``"wandb"``,
``"mlflow"``, ``"all"``; anything else is left to its own integration) and attaches them to the
run's `tgnb.train.record.Recorder`, so that what tgnb records reaches them as it is written:

- events: each of ``RunStarted``, ``RunResumed``, ``SignalReceived``, ``DrainNoticeReceived``,
  ``CheckpointSaved``, ``CheckpointRejected`` and ``RunExited`` as a count, ``tgnb/<Reason>``
  counted over every attempt (W&B: a history row at that training step, ``train/global_step``;
  MLflow: the metric ``tgnb/<Reason>`` at that step), plus ``tgnb/attempt``; the run ends with the attempt
  (W&B ``finish(exit_code)``, MLflow ``KILLED`` for a preemption, else ``FINISHED``/``FAILED``);
- metrics (``metrics=True``: the `Checkpointer`; under a Trainer, Hugging Face's own
  ``WandbCallback``/``MLflowCallback`` log them, into the run opened here) as ``train/<name>``.

The tracker run's identity is kept in the run directory (`STATE`, ``tracker.json``): the first
attempt makes it (W&B: an id derived from tgnb's run name, ``<name>-<8 hex>``, or ``$WANDB_RUN_ID``
when set; MLflow: the id the tracking server gave, or ``$MLFLOW_RUN_ID``), every later attempt
resumes it (W&B ``resume="allow"``, MLflow ``start_run(run_id=...)``). Opened before the Trainer's
callbacks set up, the run is the one they log into (``WandbCallback`` uses ``wandb.run``,
``MLflowCallback`` the active run). Nothing secret is kept: no key, no tracking URI.

wandb and mlflow (``pip install 'tgnb[tracking]'``) are imported here only, when a run asks.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.events import (
    CHECKPOINT_REJECTED,
    CHECKPOINT_SAVED,
    DRAIN_NOTICE,
    RUN_EXITED,
    RUN_RESUMED,
    RUN_STARTED,
    SIGNAL_RECEIVED,
)
from tgnb.train.record import Recorder, number

__all__ = ["STATE", "TRACKERS", "Tracker", "open_trackers", "trackers_in"]

#: The file in the run directory that keeps the tracker runs' identities across attempts.
STATE = "tracker.json"
#: The trackers tgnb keeps as one run across attempts.
TRACKERS = ("wandb", "mlflow")
#: The events a tracker receives (each as a count, at the run's step).
EVENTS = (
    RUN_STARTED,
    RUN_RESUMED,
    SIGNAL_RECEIVED,
    DRAIN_NOTICE,
    CHECKPOINT_SAVED,
    CHECKPOINT_REJECTED,
    RUN_EXITED,
)


def trackers_in(report_to: str | Iterable[str] | None) -> list[str]:
    """The trackers of `TRACKERS` that `report_to` names (``"all"``: every one installed)."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else [str(n) for n in report_to]
    names = [n.strip().lower() for n in names]
    if "all" in names:
        import importlib.util

        return [t for t in TRACKERS if importlib.util.find_spec(t) is not None]
    return [t for t in TRACKERS if t in names]


def _load_state(run_dir: Path) -> dict[str, Any]:
    try:
        state = json.loads((run_dir / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(run_dir: Path, state: dict[str, Any]) -> None:
    tmp = run_dir / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / STATE)


def _counts(run_dir: Path) -> dict[str, int]:
    """The events of `EVENTS` that earlier attempts recorded (``events.jsonl``), by reason: the
    tracker's counts go on from them."""
    counts: dict[str, int] = {}
    try:
        with open(run_dir / "events.jsonl", encoding="utf-8") as fh:
            for line in fh:
                try:
                    reason = json.loads(line).get("reason")
                except (ValueError, AttributeError):
                    continue
                if reason in EVENTS:
                    counts[reason] = counts.get(reason, 0) + 1
    except OSError:
        pass
    return counts


def _wandb_id(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:48] or "run"
    return f"{slug}-{secrets.token_hex(4)}"


class Tracker:
    """One tracker run (``kind``: ``"wandb"`` or ``"mlflow"``) fed by a Recorder's records."""

    def __init__(self, kind: str, handle: Any, run_id: str, metrics: bool) -> None:
        self.kind, self.handle, self.run_id, self.metrics = kind, handle, run_id, metrics
        self.attempt = 1  # of this run directory (`STATE` counts them)
        self.counts: dict[str, int] = {}
        self.step = 0
        self.closed = False

    def __call__(self, name: str, record: dict[str, Any]) -> None:
        """A Recorder listener: `name` is ``events.jsonl`` or ``metrics.jsonl``."""
        if self.closed:
            return
        try:
            if name == "metrics.jsonl":
                self._metrics(record)
            elif record.get("reason") in EVENTS:
                self._event(record)
        except Exception as exc:  # a tracker never stops training
            print(f"tgnb: {self.kind} logging failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _metrics(self, row: dict[str, Any]) -> None:
        self.step = int(row.get("step") or self.step)
        if not self.metrics:
            return
        values = {
            f"train/{k}": n
            for k, v in row.items()
            if k not in ("step", "time") and (n := number(v)) is not None
        }
        self._log(values)

    def _event(self, record: dict[str, Any]) -> None:
        reason = str(record["reason"])
        data = record.get("data") or {}
        step = number(data.get("step"))
        if isinstance(step, int):
            self.step = step
        self.counts[reason] = self.counts.get(reason, 0) + 1
        values: dict[str, Any] = {f"tgnb/{reason}": self.counts[reason]}
        if reason == RUN_STARTED:
            values["tgnb/attempt"] = self.attempt
        self._log(values)
        if reason == RUN_EXITED:
            self.finish(int(data.get("exit_code") or 0), str(data.get("exit_reason") or ""))

    def _log(self, values: dict[str, Any]) -> None:
        if not values:
            return
        if self.kind == "wandb":
            self.handle.log({**values, "train/global_step": self.step})
        else:
            client, run_id = self.handle
            for key, value in values.items():
                client.log_metric(run_id, key, float(value), step=self.step)

    def finish(self, exit_code: int, reason: str = "") -> None:
        """End this attempt's part of the run (a later attempt resumes it)."""
        if self.closed:
            return
        self.closed = True
        if self.kind == "wandb":
            self.handle.finish(exit_code=exit_code)
            return
        import mlflow

        status = "KILLED" if reason == "preempted" else ("FAILED" if exit_code else "FINISHED")
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status)
        else:
            client, run_id = self.handle
            client.set_terminated(run_id, status)


def _open_wandb(state: dict[str, Any], name: str, metrics: bool) -> Tracker:
    import wandb

    mine = state.setdefault("wandb", {})
    run_id = mine.get("id") or os.environ.get("WANDB_RUN_ID") or _wandb_id(name)
    project = mine.get("project") or os.environ.get("WANDB_PROJECT") or "tgnb"
    mine.update(id=run_id, project=project)
    if wandb.run is not None and wandb.run.id != run_id:
        wandb.finish()
    run = wandb.run or wandb.init(id=run_id, project=project, name=name, resume="allow")
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step", step_sync=True)
    return Tracker("wandb", run, run_id, metrics)


def _open_mlflow(state: dict[str, Any], name: str, metrics: bool) -> Tracker:
    import mlflow

    mine = state.setdefault("mlflow", {})
    given = os.environ.pop("MLFLOW_RUN_ID", None)  # taken here: the Trainer's callback would
    run_id = mine.get("run_id") or given  # start it a second time
    active = mlflow.active_run()
    if active is not None and active.info.run_id != run_id:
        mlflow.end_run()
        active = None
    if active is None:
        try:
            active = mlflow.start_run(run_id=run_id) if run_id else mlflow.start_run(run_name=name)
        except mlflow.MlflowException as exc:
            if "MLFLOW_ALLOW_FILE_STORE" not in str(exc):
                raise  # a server away: the attempt fails and is restarted
            raise TrainConfigError(  # a store MLflow will never open: final, in one line
                f"MLflow refused the tracking URI {mlflow.get_tracking_uri()!r:.120}: "
                f"{str(exc).splitlines()[0][:200]} (a file store: set MLFLOW_TRACKING_URI to "
                "sqlite:////abs/path/mlflow.db)"
            ) from None
    mine.update(run_id=active.info.run_id, experiment_id=active.info.experiment_id)
    mlflow.set_tags({"tgnb.run": name})
    return Tracker(
        "mlflow", (mlflow.MlflowClient(), active.info.run_id), active.info.run_id, metrics
    )


def open_trackers(
    recorder: Recorder, report_to: str | Iterable[str] | None, metrics: bool
) -> list[Tracker]:
    """Open (or resume) the tracker runs `report_to` names and attach them to `recorder` (rank 0
    only; see the module docstring). `metrics`: send the metrics rows too."""
    kinds = trackers_in(report_to)
    if not kinds or not recorder.enabled:
        return []
    state = _load_state(recorder.run_dir)
    state["attempts"] = int(state.get("attempts") or 0) + 1
    opened = []
    for kind in kinds:
        try:
            opener = _open_wandb if kind == "wandb" else _open_mlflow
            opened.append(opener(state, recorder.run, metrics))
        except ImportError:
            raise TrainConfigError(
                f"report_to names {kind}, which is not installed: pip install 'tgnb[tracking]' "
                f"(or pip install {kind}), or leave {kind} out of report_to"
            ) from None
    _save_state(recorder.run_dir, state)
    counts = _counts(recorder.run_dir)
    for tracker in opened:
        tracker.attempt, tracker.counts = state["attempts"], dict(counts)
        recorder.listeners.append(tracker)
    return opened
