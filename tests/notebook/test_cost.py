"""`%tg cost` arithmetic: GPU-hours by node class and the work lost to preemptions, from the event
sequences the training runtime and the local backend write (seen in the end-to-end runs)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tgnb import prices
from tgnb.errors import ValidationError
from tgnb.events import Event
from tgnb.notebook.cost import run_cost, session_cost
from tgnb.prices import Prices

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
    report = session_cost({"a": (events, 8), "b": (events, 16)}, Prices(3.0, 1.0, "test"))
    assert report.total("preemptible_gpu_hours") == pytest.approx(24)
    assert report.cost == pytest.approx(24.0)
    text = str(report)
    assert "total" in text and "<table " in report._repr_html_()
    assert "$8.00" in text and "$16.00" in text and "cost $24.00" in text  # per run, in all
    assert "$3.00/GPU-h standard, $1.00/GPU-h preemptible (from test)" in text
    no_prices = session_cost({"a": (events, 8)})
    assert no_prices.cost is None and "%config Tg.standard_price" in str(no_prices)


def test_prices_resolve_override_then_api_then_published_table() -> None:
    """The order of `tgnb.prices.resolve`, and bad prices and budgets refused with the fix."""
    api = {"currency": "USD", "standard_per_gpu_hour": 4.0, "preemptible_per_gpu_hour": 2.0}
    from_api = prices.resolve("H100_SXM", api)
    assert from_api is not None and (from_api.standard, from_api.preemptible) == (4.0, 2.0)
    table = prices.resolve("H100_SXM")
    assert table is not None and table.standard == prices.PUBLISHED["H100_SXM"]
    assert table.source == prices.FROM_TABLE
    both = prices.resolve("H100_SXM", api, preemptible=0.5)
    assert both is not None and (both.standard, both.preemptible) == (4.0, 0.5)
    assert both.source.startswith("%config")
    assert prices.resolve("NO_SUCH_GPU") is None
    assert prices.resolve("NO_SUCH_GPU", standard=1, preemptible=0.5) is not None
    with pytest.raises(ValidationError, match=r">= 0 dollars per GPU-hour.*Tg.standard_price"):
        prices.check_price(-1, "standard")
    with pytest.raises(ValidationError, match="must be a number of dollars"):
        prices.check_price("cheap", "preemptible")
    with pytest.raises(ValidationError, match=r"more than 0 dollars.*budget_usd=25"):
        prices.check_budget(-5)
    with pytest.raises(ValidationError, match=r"number of dollars.*budget_usd=25"):
        prices.check_budget("ten")
