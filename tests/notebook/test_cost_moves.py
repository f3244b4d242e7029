"""`%tg cost` for a run that moved between node classes (`when_short="standard"`): the event
sequence the local supervisor and the training runtime write (seen in
tests/backends/local/test_recovery_standard_trl.py). Going back to preemptible nodes stops the run
with SIGTERM (it exits 75, as for a preemption), and the requeue says ``moved``: GPU-hours on the
standard node, and no preemption."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tgnb.events import Event
from tgnb.notebook.cost import run_cost

T0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
P1, P2, STD = "gpu-preemptible-dp-a-0", "gpu-preemptible-dp-a-1", "gpu-dp-a-0"


def ev(s: float, reason: str, node: str, source: str = "run", **data: object) -> Event:
    return Event(T0 + timedelta(seconds=s), source, reason, node=node, run="r", data=data)


def exited(s: float, node: str, step: int) -> Event:
    return ev(s, "RunExited", node, exit_reason="preempted", exit_code=75, step=step)


@pytest.mark.parametrize("moved", [True, False])
def test_the_move_back_is_standard_time_and_no_preemption(moved: bool) -> None:
    events = [
        ev(0, "RunStarted", P1),
        ev(100, "CheckpointSaved", P1, step=20),
        exited(100, P1, 20),
        ev(101, "RunRequeued", P1, "tgnb", exit_code=75),
        ev(200, "RunStarted", STD),
        ev(201, "RunResumed", STD, step=20),
        ev(500, "CheckpointSaved", STD, step=80),
        exited(500, STD, 80),
        ev(501, "RunRequeued", STD, "tgnb", exit_code=75, **({"moved": True} if moved else {})),
        ev(600, "RunStarted", P2),
        ev(601, "RunResumed", P2, step=80),
        ev(900, "RunExited", P2, exit_reason="finished", exit_code=0, step=140),
    ]
    cost = run_cost("r", events, gpus=8, now=T0 + timedelta(hours=1))
    assert cost.preemptions == (1 if moved else 2)  # before the fix: 2 either way
    assert cost.standard_gpu_hours == pytest.approx(300 * 8 / 3600)
    assert cost.preemptible_gpu_hours == pytest.approx((100 + 300) * 8 / 3600)
    assert cost.lost_gpu_hours == 0 and cost.lost_steps == 0
