"""A sweep's ``budget_usd`` (`tgnb.sweep.wait`) on the local emulator: two runs of the stand-in
training program (the supervisor tests' stand-in: placement and signals without TRL) are priced
together at the emulator's prices; a notice at 80 %, then at the budget both are stopped (each
checkpoints on its SIGTERM) and the preemptible target is dropped to 0 on the emulator."""

from __future__ import annotations

import pytest

from tgnb import sweep
from tgnb.errors import ValidationError
from tgnb.runs.spec import JobState
from tgnb.session import Session

BUDGET_SECONDS = 20.0  # of both runs' preemptible GPUs at the emulator's price


@pytest.mark.usefixtures("standin")
def test_a_sweep_budget_stops_its_runs_and_drops_the_target(session: Session) -> None:
    prices = session.prices()
    assert prices is not None
    budget = round(prices.preemptible * 16 * BUDGET_SECONDS / 3600, 4)
    env = {"STANDIN_STEP_SECONDS": "0.1"}
    runs = [session.launch("grpo", name=f"sweep-{i}", max_steps=100_000, env=env) for i in range(2)]
    said: list[str] = []
    outcome = sweep.wait(session, runs, budget, poll=0.3, timeout=300, say=said.append)
    assert outcome.stopped and outcome.spent_usd >= budget and outcome.target == 0, outcome
    assert len(said) == 2 and "80 % of the budget spent" in said[0], said
    assert "budget reached" in said[1] and "target dropped to 0" in said[1], said
    assert session.status().desired_preemptible_gpus == 0
    for run in runs:
        assert run.status.state == JobState.CANCELLED
        assert run.run_dir is not None and (run.run_dir / "standin-checkpoint.json").exists()


@pytest.mark.parametrize(
    ("budget", "target", "says"),
    [(-1, 0, "more than 0 dollars"), ("x", 0, "number of dollars"), (5, -8, "target_after")],
)
def test_bad_sweep_budgets_are_refused_before_anything_is_done(
    session: Session, budget: object, target: object, says: str
) -> None:
    before = session.status().desired_preemptible_gpus
    with pytest.raises(ValidationError, match=says):
        sweep.wait(session, [], budget, target_after=target)  # type: ignore[arg-type]
    assert session.status().desired_preemptible_gpus == before
