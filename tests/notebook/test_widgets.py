"""ClusterPanel and RunPanel: built on a real emulator cluster and a real run store with records
written by the training runtime's own `Recorder`; their static HTML; polling that stops."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, RunSpec
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import CHECKPOINT_SAVED, RUN_RESUMED, RUN_STARTED, SIGNAL_RECEIVED
from tgnb.notebook.widgets import ClusterPanel, Poller, RunPanel
from tgnb.runs import Run, RunStore
from tgnb.train.record import Recorder

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def recorded_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A run in a real store whose run directory holds events and metrics from `Recorder`:
    started on one preemptible node, checkpointed, signalled, resumed on another node."""
    store = RunStore(tmp_path / "home")
    spec = RunSpec(name="grpo-a", train={"algorithm": "grpo", "max_steps": 10})
    run_dir = tmp_path / "runs" / "grpo-a"
    rec = store.create(spec, backend="local", run_dir=run_dir)
    monkeypatch.setenv("TGNB_NODE", "gpu-preemptible-dp-1")
    r = Recorder(run_dir, run="grpo-a")
    r.event(RUN_STARTED)
    for step in range(1, 5):
        r.metric(step, reward=0.1 * step, loss=1.0 / step)
    r.event(CHECKPOINT_SAVED, step=4)
    r.event(SIGNAL_RECEIVED, "SIGTERM")
    monkeypatch.setenv("TGNB_NODE", "gpu-preemptible-dp-2")
    r2 = Recorder(run_dir, run="grpo-a")
    r2.event(RUN_RESUMED, step=4)
    for step in range(5, 7):
        r2.metric(step, reward=0.1 * step, loss=1.0 / step)
    store.set_state(rec.id, JobState.RUNNING, "running")
    return Run(store.get(rec.id), store)


def test_run_panel_progress_curves_and_markers(recorded_run: Run) -> None:
    panel = RunPanel(recorded_run, start=False)
    panel.refresh()
    assert (panel.progress.value, panel.progress.max) == (6, 10)
    assert "step 6 / 10" in panel.progress_label.value and "ETA" in panel.progress_label.value
    assert sorted(panel.markers()) == [(4.0, "checkpoint"), (4.0, "preemption"), (4.0, "resume")]
    for svg in (panel.reward_plot.value, panel.loss_plot.value):
        root = ET.fromstring(svg)
        classes = [el.get("class") for el in root.iter()]
        assert "series" in classes
        assert {"mark checkpoint", "mark preemption", "mark resume"} <= set(classes)
        # the three share step 4: drawn side by side, each with its own dashes, not one line
        marks = [el for el in root.iter() if (el.get("class") or "").startswith("mark ")]
        assert len({el.get("x1") for el in marks}) == 3
        assert len({el.get("stroke-dasharray") for el in marks}) == 3
        assert all(
            "checkpoint, preemption, resume at step 4" in "".join(el.itertext()) for el in marks
        )
    assert "gpu-preemptible-dp-2" in panel.header.value
    bundle = panel._repr_mimebundle_()
    assert WIDGET_VIEW in bundle
    assert "tgnb-run-panel" in bundle["text/html"] and "<svg" in bundle["text/html"]
    assert "tgnb-curve" in panel.snapshot().data
    panel.close()


def _wait_stopped(poller: Poller) -> bool:
    thread = poller._thread
    assert thread is not None
    thread.join(timeout=30)
    return not thread.is_alive()


def test_run_panel_polling_stops_when_closed(recorded_run: Run) -> None:
    panel = RunPanel(recorded_run, poll_interval=0.05)
    assert panel._poller.running
    panel.close()
    assert _wait_stopped(panel._poller)


def test_run_panel_polling_stops_when_the_run_finishes(recorded_run: Run) -> None:
    panel = RunPanel(recorded_run, poll_interval=0.05)
    assert panel._poller.running
    recorded_run.store.set_state(recorded_run.id, JobState.SUCCEEDED, "done")
    assert _wait_stopped(panel._poller)
    assert panel.state == "succeeded" and panel.progress.bar_style == "success"
    panel.close()


def test_cluster_panel_shows_and_scales(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    panel = ClusterPanel(tg.session, poll_interval=0.05)
    try:
        assert panel._poller.running
        assert panel.state is not None and panel.target.step == 8
        assert "allocated 0 / desired 0" in panel.progress_label.value
        assert "gpu-dp" in panel.nodes.value  # the standard node is listed
        panel.target.value = 8
        panel.apply.click()
        puts = [r["body"] for r in attached.requests() if r["method"] == "PUT"]
        assert puts == [{"num_preemptible_gpus": 8}]
        assert panel.error.value == ""
        wait_until(lambda: panel.state.allocated_preemptible_gpus >= 8, 60, what="8 GPUs")
        assert panel.state.allocated_preemptible_gpus == 8
        assert "gpu-preemptible-dp" in panel.to_html()
        bundle = panel._repr_mimebundle_()
        assert "text/html" in bundle and WIDGET_VIEW in bundle
    finally:
        panel.close()
    assert _wait_stopped(panel._poller)


def test_cluster_panel_shows_a_refused_target(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    panel = ClusterPanel(tg.session, start=False)
    panel.refresh()
    panel.target.value = 12  # typed, not slid: the Session refuses it and nothing is sent
    panel.apply.click()
    assert "multiple of 8" in panel.error.value
    assert [r for r in attached.requests() if r["method"] == "PUT"] == []
    panel.close()


def test_grpo_panel_draws_what_moves_not_a_flat_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GRPO's loss is ~0 whatever it learns (rows as TRL logs them: loss 1e-5, reward_std
    moving): the second chart is reward_std, and the panel says why; a DPO run keeps its loss."""
    store = RunStore(tmp_path / "home")
    monkeypatch.setenv("TGNB_NODE", "gpu-preemptible-dp-1")
    panels = {}
    for algorithm in ("grpo", "dpo"):
        spec = RunSpec(name=f"{algorithm}-b", train={"algorithm": algorithm, "max_steps": 4})
        run_dir = tmp_path / "runs" / algorithm
        rec = store.create(spec, backend="local", run_dir=run_dir)
        r = Recorder(run_dir, run=f"{algorithm}-b")
        for step in range(1, 5):
            r.metric(
                step, reward=0.1 * step, loss=1e-5 * (-1) ** step, reward_std=0.1 + 0.05 * step
            )
        panel = RunPanel(Run(store.get(rec.id), store), start=False)
        panel.refresh()
        panels[algorithm] = panel
    grpo, dpo = panels["grpo"], panels["dpo"]
    assert ">reward_std</text>" in grpo.loss_plot.value
    assert "sits near 0 by construction" in grpo.note.value
    assert "sits near 0 by construction" in grpo.to_html()
    assert ">loss</text>" in dpo.loss_plot.value and dpo.note.value == ""
    for panel in panels.values():
        panel.close()
