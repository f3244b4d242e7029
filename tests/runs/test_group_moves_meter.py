"""A replica group moved between node classes by the recovery policy (issue 50, the local engine's
`tgnb.backends.local.groupplace`), on a plain list of events as that engine records them: each
``JobPlaced`` says the class of the group's node, so the stretch on the standard node is priced
at the standard rate; the move back (``JobReleased`` cause ``moved``, ``GroupLeft`` cause
``moved``) is neither a preemption nor lost work, and the summary says the group moved."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tgnb.events import GROUP_JOINED, GROUP_LEFT, JOB_PLACED, JOB_RELEASED, QUORUM_CHANGED, Event
from tgnb.prices import Prices
from tgnb.runs import meter
from tgnb.runs.cost import run_cost
from tgnb.runs.replicas import group_lines

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
GPUS = 8


def ev(t: float, reason: str, node: str | None = None, **data: Any) -> Event:
    return Event(T0 + timedelta(seconds=t), "tgnb", reason, reason, node=node, run="r", data=data)


def placed(t: float, node: str, group: int, cls: str) -> Event:
    return ev(t, JOB_PLACED, node, restart_count=0, gpus=GPUS, node_class=cls, group=group)


def left(t: float, node: str, group: int, release: str, cause: str, code: int) -> list[Event]:
    return [
        ev(t, JOB_RELEASED, node, restart_count=0, gpus=GPUS, cause=release, group=group,
           exit_code=code),
        ev(t, GROUP_LEFT, node, group=group, cause=cause, exit_code=code),
    ]  # fmt: skip


def moved_run() -> list[Event]:
    """Group 0 preempted at 100 s, on the standard node ``s`` from 110 to 400 s, moved back to the
    preemptible node ``c`` at 400 s; group 1 on ``b`` throughout."""
    return [
        placed(0, "a", 0, "preemptible"),
        placed(0, "b", 1, "preemptible"),
        ev(10, QUORUM_CHANGED, groups=[0, 1], step=0, quorum_id=1, waited_s=0.0),
        *left(100, "a", 0, meter.PREEMPTED, "notice", 143),
        ev(102, QUORUM_CHANGED, groups=[1], step=50, quorum_id=2, waited_s=2.0),
        placed(110, "s", 0, "standard"),
        ev(110, GROUP_JOINED, "s", group=0, replacement=True, node_class="standard"),
        ev(150, QUORUM_CHANGED, groups=[0, 1], step=70, quorum_id=3, waited_s=48.0),
        *left(400, "s", 0, meter.MOVED, "moved", 143),
        ev(402, QUORUM_CHANGED, groups=[1], step=200, quorum_id=4, waited_s=2.0),
        placed(401, "c", 0, "preemptible"),
        ev(401, GROUP_JOINED, "c", group=0, replacement=True, node_class="preemptible"),
        *left(1000, "c", 0, meter.DONE, "finished", 0),
        *left(1000, "b", 1, meter.DONE, "finished", 0),
    ]


def test_the_standard_stretch_is_priced_standard_and_the_move_is_no_preemption() -> None:
    runs = meter.stretches(moved_run())
    mine = [(s.node, s.node_class, s.cause) for s in runs if s.group == 0]
    assert mine == [("a", "preemptible", "preempted"), ("s", "standard", "moved"),
                    ("c", "preemptible", "done")], runs  # fmt: skip
    assert [s.node for s in meter.preempted_groups(runs)] == ["a"]
    cost = run_cost("r", moved_run(), gpus=GPUS)
    assert cost.standard_gpu_hours == pytest.approx(290 * GPUS / 3600)
    assert cost.preemptible_gpu_hours == pytest.approx((100 + 1000 + 599) * GPUS / 3600)
    assert cost.preemptions == 1 and cost.lost_node_seconds == 0, cost
    prices = Prices(standard=3.0, preemptible=1.5)
    usd = cost.dollars(prices)
    assert usd == pytest.approx((290 * 3.0 + 1699 * 1.5) * GPUS / 3600)


def test_the_summary_says_the_group_moved() -> None:
    lines = group_lines(moved_run())
    moved = [line for line in lines if "moved back to a preemptible node" in line]
    assert moved and moved[0].startswith("group 0 left at step 200: "), lines
