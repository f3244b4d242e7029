"""A run's ``budget_usd`` end to end on the local emulator, through the real training runtime: it
is priced as it trains at the emulator's prices (its GPU type's published rates, served over
HTTP), gets a ``BudgetNotice`` at 80 %, then at the budget a ``BudgetReached`` and the stop a
cancel makes: the runtime seals a checkpoint (marker written last) and the run ends cancelled.
Nothing is faked."""

from __future__ import annotations

import pytest

from tgnb.errors import ValidationError
from tgnb.events import BUDGET_NOTICE, BUDGET_REACHED, CHECKPOINT_SAVED
from tgnb.notebook.widgets import RunPanel
from tgnb.prices import dollars
from tgnb.runs.spec import JobState
from tgnb.session import Session
from tgnb.train.checkpoint import checkpoint_dirs, read_marker

#: Seconds of training (in preemptible GPU-hours at the emulator's price) the budget buys.
BUDGET_SECONDS = 20.0  # its last 20 % (4 s) spans about four of the supervisor's 1 s checks


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_budget_notice_at_80_percent_then_stopped_with_a_sealed_checkpoint(
    session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = session.prices()
    assert prices is not None and prices.source == "the platform's API"
    gpus = 8
    budget = round(prices.preemptible * gpus * BUDGET_SECONDS / 3600, 4)
    run = session.launch(
        "sft", name="budgeted", max_steps=100_000, gpus_per_node=gpus, budget_usd=budget
    )
    assert run.record.spec.prices == prices  # the launch's prices travel with the run
    status = run.wait(timeout=600, progress=False)
    assert status.state == JobState.CANCELLED, status
    assert status.detail.startswith("budget reached at $"), status
    assert status.exit_code == 77, status  # one exit code for a budget stop, as documented
    told = capsys.readouterr().err  # run.wait prints the budget's notices as they come
    assert "run budgeted: 80 % of the budget spent" in told, told
    assert "the run will be stopped when it reaches the budget" in told, told  # not "stopped"
    assert "run budgeted: budget reached at $" in told and "stopping the run" in told, told

    evs = run.run_events()
    notice = next(e for e in evs if e.reason == BUDGET_NOTICE)
    reached = next(e for e in evs if e.reason == BUDGET_REACHED)
    assert notice.time < reached.time, (notice, reached)
    assert 0.8 * budget <= notice.data["spent_usd"] < budget, notice.data
    assert reached.data["spent_usd"] >= budget, reached.data

    assert run.run_dir is not None
    sealed = [m for p in checkpoint_dirs(run.run_dir / "checkpoints") if (m := read_marker(p))]
    at_stop = [e for e in evs if e.reason == CHECKPOINT_SAVED and e.time >= reached.time]
    assert at_stop, "no checkpoint saved at the stop"
    assert at_stop[-1].data["step"] in {m.step for m in sealed}  # its marker written: sealed
    summary = run.summary()
    assert summary["preemptions"] == 0, summary  # a budget stop is no preemption
    assert summary["budget_usd"] == budget
    assert summary["cost_usd"] is not None and summary["cost_usd"] >= budget
    assert summary["gpu_hours"] > 0
    panel = RunPanel(run, start=False)  # the RunPanel's header says it too
    try:
        panel.refresh()
        assert f"of its {dollars(budget)} budget" in panel.header.value
    finally:
        panel.close()


@pytest.mark.parametrize("bad", [-5, 0, "ten", float("nan")])
def test_a_bad_budget_is_refused_before_anything_is_recorded(session: Session, bad: object) -> None:
    with pytest.raises(ValidationError, match=r"budget_usd.*e\.g\. budget_usd=25"):
        session.launch("sft", name="bad-budget", max_steps=5, budget_usd=bad)  # type: ignore[arg-type]
    assert session.store.find("bad-budget") is None


@pytest.mark.parametrize("which", ["preemptible", "standard"])
def test_a_budget_priced_at_zero_is_refused_with_the_fix(session: Session, which: str) -> None:
    """A budget at $0 per GPU-hour could never be reached: refused at launch, naming the price
    to set, and nothing is recorded."""
    prices = session.prices()
    assert prices is not None
    free = prices.override(**{which: 0.0})
    pattern = rf"the {which} price is 0.0 .*%config Tg\.{which}_price = 2\.5"
    with pytest.raises(ValidationError, match=pattern):
        session.launch("sft", name="free", max_steps=5, budget_usd=1.0, prices=free,
                       preemptible=which == "preemptible")  # fmt: skip
    assert session.store.find("free") is None
