"""`%tg cost` arithmetic: GPU-hours by node class and the work lost to preemptions, from the event
sequences the training runtime and the local backend write (seen in the end-to-end runs)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tgnb.events import Event
from tgnb.notebook.cost import run_cost, session_cost

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
P1, P2, STD = "gpu-preemptible-dp-a-0", "gpu-preemptible-dp-a-1", "gpu-dp-a-0"


def run_ev(s: float, reason: str, node: str, **data: object) -> Event:
    return Event(T0 + timedelta(seconds=s), "run", reason, node=node, run="r", data=data)


def test_signal_checkpoint_exit_then_requeue_counts_one_preemption() -> None:
    events = [
        run_ev(0, "JobPlaced", P1),
        run_ev(10, "RunStarted", P1),
        run_ev(910, "CheckpointSaved", P1, step=90),
        run_ev(1000, "SignalReceived", P1, step=99),
        run_ev(1010, "CheckpointSaved", P1, step=99),
        run_ev(1010, "RunExited", P1, exit_reason="preempted", exit_code=75, step=99),
        run_ev(1020, "RunRequeued", P1),
        run_ev(1400, "RunStarted", P2),
        run_ev(1405, "RunResumed", P2, step=99),
        run_ev(2200, "RunExited", P2, exit_reason="finished", exit_code=0, step=200),
    ]
    cost = run_cost("r", events, gpus=8, now=T0 + timedelta(hours=5))
    assert cost.preemptions == 1
    assert cost.standard_gpu_hours == 0
    assert cost.preemptible_gpu_hours == pytest.approx((1000 + 800) * 8 / 3600)
    assert cost.lost_gpu_hours == 0  # the checkpoint in the drain window saved everything
    assert cost.lost_steps == 0


def test_killed_without_checkpoint_loses_the_stretch_since_the_last_one() -> None:
    events = [
        run_ev(0, "RunStarted", P1),
        run_ev(360, "CheckpointSaved", P1, step=30),
        run_ev(720, "RunRequeued", P1, step=60),  # SIGKILL at the end of the drain window
        run_ev(800, "RunStarted", STD),
    ]
    cost = run_cost("r", events, gpus=8, now=T0 + timedelta(seconds=1160))
    assert cost.preemptions == 1
    assert cost.lost_gpu_hours == pytest.approx(360 * 8 / 3600)
    assert cost.lost_steps == 30
    assert cost.standard_gpu_hours == pytest.approx(360 * 8 / 3600)  # still running on STD


def test_report_totals_and_prices() -> None:
    events = [run_ev(0, "RunStarted", P1), run_ev(3600, "RunExited", P1, exit_code=0)]
    report = session_cost({"a": (events, 8), "b": (events, 16)}, 3.0, 1.0)
    assert report.total("preemptible_gpu_hours") == pytest.approx(24)
    assert report.cost == pytest.approx(24.0)
    assert "total" in str(report) and "<table " in report._repr_html_()
    assert session_cost({"a": (events, 8)}).cost is None
