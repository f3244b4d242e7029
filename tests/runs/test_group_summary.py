"""A fault-tolerant run's replica groups (issue 50) in its meter, cost and summary, on plain lists
of events as the local engine records them (`tgnb.backends.local.groups`): each group's node from
its ``JobPlaced`` to its ``JobReleased``, a replacement's from its own placement, the gap between
them held nothing, the lighthouse never placed (it costs nothing); the summary's lines name who
left, joined and healed, from whom, at which step and in how long, the step counted once."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tgnb.events import (
    GROUP_HEALED,
    GROUP_JOINED,
    GROUP_LEFT,
    JOB_PLACED,
    JOB_RELEASED,
    LIGHTHOUSE_STARTED,
    QUORUM_CHANGED,
    Event,
)
from tgnb.prices import Prices, dollars
from tgnb.runs import meter
from tgnb.runs.cost import run_cost
from tgnb.runs.replicas import UNPROTECTED_GROUPS, group_lines
from tgnb.runs.summary import closing_line, spending, summarize

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
PRICES = Prices(standard=3.0, preemptible=1.5)
GPUS = 8


def ev(t: float, reason: str, node: str | None = None, **data: Any) -> Event:
    return Event(T0 + timedelta(seconds=t), "tgnb", reason, reason, node=node, run="r", data=data)


def placed(t: float, node: str, group: int, restart: int = 0) -> Event:
    return ev(t, JOB_PLACED, node, restart_count=restart, gpus=GPUS, node_class="preemptible",
              group=group)  # fmt: skip


def released(t: float, node: str, group: int, cause: str, restart: int = 0) -> Event:
    return ev(t, JOB_RELEASED, node, restart_count=restart, gpus=GPUS, cause=cause, group=group)


def uninterrupted() -> list[Event]:
    return [
        ev(0, LIGHTHOUSE_STARTED),  # on no node: holds nothing
        placed(1, "a", 0),
        ev(1, GROUP_JOINED, "a", group=0, replacement=False),
        placed(1.5, "b", 1),
        ev(1.5, GROUP_JOINED, "b", group=1, replacement=False),
        ev(10, QUORUM_CHANGED, groups=[0, 1], step=0, quorum_id=1, waited_s=0.0),
        released(101, "a", 0, "done"),
        ev(101, GROUP_LEFT, "a", group=0, cause="finished", exit_code=0),
        released(101.5, "b", 1, "done"),
        ev(101.5, GROUP_LEFT, "b", group=1, cause="finished", exit_code=0),
    ]


def preempted_and_replaced() -> list[Event]:
    """Group 0 on node a is preempted at 40 s (left at step 300); the survivor, group 1 on b,
    trains on; the replacement is placed on c at 60 s and heals from group 1 at step 420."""
    return [
        ev(0, LIGHTHOUSE_STARTED),
        placed(1, "a", 0),
        ev(1, GROUP_JOINED, "a", group=0, replacement=False),
        placed(1, "b", 1),
        ev(1, GROUP_JOINED, "b", group=1, replacement=False),
        ev(10, QUORUM_CHANGED, groups=[0, 1], step=0, quorum_id=1, waited_s=0.0),
        released(41, "a", 0, "preempted"),
        ev(41, GROUP_LEFT, "a", group=0, cause="notice", exit_code=-15),
        ev(42, QUORUM_CHANGED, groups=[1], step=301, quorum_id=302, waited_s=2.25),
        placed(60, "c", 0),
        ev(60, GROUP_JOINED, "c", group=0, replacement=True),
        ev(66, QUORUM_CHANGED, groups=[0, 1], step=420, quorum_id=421, waited_s=0.5),
        ev(66, GROUP_HEALED, group=0, step=420, source=1, took_s=6.0, from_step=0),
        released(120, "b", 1, "done"),
        ev(120, GROUP_LEFT, "b", group=1, cause="finished", exit_code=0),
        released(120.5, "c", 0, "done"),
        ev(120.5, GROUP_LEFT, "c", group=0, cause="finished", exit_code=0),
    ]


def held_hours(*seconds: float) -> float:
    return sum(seconds) * GPUS / 3600


def test_an_uninterrupted_runs_groups_are_each_metered_once_and_the_lighthouse_is_free() -> None:
    evs = uninterrupted()
    runs = meter.stretches(evs)
    assert [(s.node, s.group, s.cause) for s in runs] == [("a", 0, "done"), ("b", 1, "done")]
    cost = run_cost("r", evs, GPUS * 2)
    assert cost.preemptible_gpu_hours == pytest.approx(held_hours(100, 100))
    assert cost.standard_gpu_hours == 0  # the lighthouse holds no node
    assert (cost.preemptions, cost.lost_node_seconds) == (0, 0)
    assert cost.dollars(PRICES) == pytest.approx(held_hours(200) * PRICES.preemptible)


def test_a_replacements_node_counts_and_the_gap_before_it_does_not() -> None:
    evs = preempted_and_replaced()
    runs = meter.stretches(evs)
    # the survivor's stretch is not cut by the replacement's placement (same restart count)
    assert [(s.node, s.group, s.start, s.end, s.cause) for s in runs] == [
        ("a", 0, runs[0].start, runs[0].start + 40, "preempted"),
        ("b", 1, runs[1].start, runs[1].start + 119, "done"),
        ("c", 0, runs[2].start, runs[2].start + 60.5, "done"),
    ]
    cost = run_cost("r", evs, GPUS * 2)
    # a: 40 s, b: 119 s, c: 60.5 s; group 0's 19 s without a node (41 -> 60) are not counted
    assert cost.preemptible_gpu_hours == pytest.approx(held_hours(40, 119, 60.5))
    assert cost.preemptions == 1
    # the survivor held its node at the preemption: the run redid nothing
    assert (cost.lost_node_seconds, cost.lost_gpu_hours) == (0, 0)
    # the lighthouse's quorums give the run's step: none lost, the quorum never went back
    assert cost.lost_steps == 0


def test_a_group_placed_again_on_slurm_ends_only_its_own_stretch() -> None:
    """On Slurm each group of the array has its own restart count: group 0 requeued (restart 1)
    with no release recorded ends its own stretch as lost, never group 1's (restart 0)."""
    evs = [
        placed(0, "a", 0),
        placed(0, "b", 1),
        placed(30, "c", 0, restart=1),  # group 0's node vanished (no release), requeued
        released(90, "b", 1, "done"),
        released(90, "c", 0, "done", restart=1),
    ]
    runs = meter.stretches(evs)
    assert [(s.node, s.end - s.start, s.cause) for s in runs] == [
        ("a", 30, "lost"),
        ("b", 90, "done"),
        ("c", 60, "done"),
    ]
    cost = run_cost("r", evs, GPUS * 2)
    assert cost.preemptible_gpu_hours == pytest.approx(held_hours(30, 90, 60))
    assert cost.preemptions == 1 and cost.lost_node_seconds == 0  # lost, then placed again


def test_every_group_lost_redoes_what_it_did_since_its_checkpoint() -> None:
    """No survivor held a node at the preemption: as an attempt's, the node-time after the last
    checkpoint is redone."""
    evs = [
        placed(0, "a", 0),
        Event(T0 + timedelta(seconds=20), "run", "CheckpointSaved", "", run="r", data={"step": 5}),
        released(50, "a", 0, "preempted"),
        placed(60, "b", 0),
        released(90, "b", 0, "done"),
    ]
    cost = run_cost("r", evs, GPUS)
    assert cost.preemptions == 1
    assert cost.lost_node_seconds == pytest.approx(30)


def summary_of(evs: list[Event]) -> dict[str, Any]:
    cost = run_cost("r", evs, GPUS * 2)
    return summarize("r", "succeeded", [], evs, cost, max_steps=None, restarts=0, kind="script",
                     spending=spending(cost, PRICES, None))  # fmt: skip


def test_the_summary_names_who_left_joined_and_healed() -> None:
    evs = preempted_and_replaced()
    summary = summary_of(evs)
    assert summary["groups"] == [
        "groups: 2 at the start (0 on a, 1 on b); 1 left before the end, 1 replacement(s) joined, "
        "1 healed",
        "group 0 left at step 301: preempted (notice); groups [1] went on after 2.2 s",
        "group 0 joined again (replacement) on c; healed from group 1 at step 420, 6.0 s after "
        "it started",
    ]
    assert summary["preemptions"] == 1 and summary["steps"] is None
    # a plain TorchFT program: no checkpoint of tgnb's, yet a preempted group heals
    assert summary["note"] == UNPROTECTED_GROUPS and not summary["protected"], summary
    line = closing_line("r", "succeeded", "finished", summary)
    assert line.endswith("1 preemption; " + summary["groups"][0]), line
    assert f"GPU-h, {dollars(summary['cost_usd'])}, 1 preemption" in line


def test_an_uninterrupted_runs_summary_has_one_groups_line() -> None:
    summary = summary_of(uninterrupted())
    assert summary["groups"] == [
        "groups: 2 at the start (0 on a, 1 on b); 0 left before the end, 0 replacement(s) "
        "joined, 0 healed"
    ]


def test_a_lost_group_a_budget_stop_and_a_replacement_never_healed_read_so() -> None:
    evs = [
        placed(0, "a", 0),
        ev(0, GROUP_JOINED, "a", group=0, replacement=False),
        placed(0, "b", 1),
        ev(0, GROUP_JOINED, "b", group=1, replacement=False),
        ev(5, QUORUM_CHANGED, groups=[0, 1], step=0, quorum_id=1, waited_s=0.0),
        released(20, "b", 1, "failed"),
        ev(20, GROUP_LEFT, "b", group=1, cause="lost", exit_code=-9),
        placed(30, "c", 1),
        ev(30, GROUP_JOINED, "c", group=1, replacement=True),
        released(40, "a", 0, "budget"),
        ev(40, GROUP_LEFT, "a", group=0, cause="budget", exit_code=-15),
        released(40, "c", 1, "budget"),
        ev(40, GROUP_LEFT, "c", group=1, cause="budget", exit_code=-15),
    ]
    lines = group_lines(evs)
    assert lines[1:] == [
        "group 1 left at step 0: lost (exit -9)",  # no quorum after it: the last one's step
        "group 1 joined again (replacement) on c; not healed (it never entered a quorum)",
        "group 0 left at step 0: stopped at the budget",
        "group 1 left at step 0: stopped at the budget",
    ]
    cost = run_cost("r", evs, GPUS * 2)
    assert cost.preemptions == 0  # a failure and a budget stop: no preemption


def test_a_run_of_one_group_has_no_groups_lines() -> None:
    evs = [
        ev(0, JOB_PLACED, "a", restart_count=0, gpus=GPUS),
        ev(9, JOB_RELEASED, "a", restart_count=0, gpus=GPUS, cause="done"),
    ]
    assert group_lines(evs) == [] and summary_of(evs)["groups"] is None
    assert ";" not in closing_line("r", "succeeded", "", summary_of(evs)).split("GPU-h")[1]


def test_a_slurm_or_kubernetes_groups_node_meters_itself_as_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's own meter (`tgnb.train.budget.NodeMeter`, Slurm and Kubernetes) records the
    replica group the engine gave it, so a requeued group (its own restart count) ends only its
    own stretch; outside a fault-tolerant run it records none."""
    from tgnb.events import read_jsonl
    from tgnb.runs import ft, node
    from tgnb.train.budget import NodeMeter

    monkeypatch.delenv(node.METERED_ENV, raising=False)
    monkeypatch.setenv(node.GPUS_ENV, "8")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    for env, groups in (({}, [None, None]), (ft.group_env("http://h:1", 1, 2), [1, 1])):
        run_dir = tmp_path / str(len(env))
        run_dir.mkdir()
        for name in (ft.LIGHTHOUSE_ENV, ft.REPLICA_GROUP_ENV):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        NodeMeter(str(run_dir)).release(0, meter.DONE)
        evs = read_jsonl(run_dir / node.EVENTS)
        assert [e.data.get("group") for e in evs] == groups, evs
        assert [e.data.get("restart_count") for e in evs] == [2, 2]
        assert [(s.group, s.attempt, s.cause) for s in meter.stretches(evs)] == [
            (groups[0], 2, "done")
        ]


def test_groups_preempted_together_both_redo_what_they_did_since_the_checkpoint() -> None:
    """Both groups' nodes preempted within a second: neither survived the other (no replacement
    was placed while either held its node), so each redoes its node-time since the checkpoint."""
    evs = [
        placed(0, "a", 0),
        placed(0, "b", 1),
        Event(T0 + timedelta(seconds=20), "run", "CheckpointSaved", "", run="r", data={"step": 5}),
        released(50, "a", 0, "preempted"),
        released(50.5, "b", 1, "preempted"),
        placed(70, "c", 0),
        placed(70, "d", 1),
        released(90, "c", 0, "done"),
        released(90, "d", 1, "done"),
    ]
    cost = run_cost("r", evs, GPUS * 2)
    assert cost.preemptions == 2
    assert cost.lost_node_seconds == pytest.approx(30 + 30.5)


def test_each_groups_start_is_no_restart_and_a_healed_group_loses_no_step() -> None:
    """Both groups log their steps through tgnb's hooks (a ``RunStarted`` each, rows of the same
    steps): the steps are counted once, and the replacement's start, which healed at the
    quorum's step, loses none (as restarts, the replacement's start lost 300)."""
    evs = preempted_and_replaced()
    for t in (2, 2.5, 61):
        evs.append(Event(T0 + timedelta(seconds=t), "run", "RunStarted", "", run="r", data={}))
    rows = [{"step": k, "time": (T0 + timedelta(seconds=10 + k / 10)).timestamp()} for k in
            range(1, 301)] * 2  # fmt: skip
    rows += [{"step": k, "time": (T0 + timedelta(seconds=66 + k / 100)).timestamp()} for k in
             range(421, 701)]  # fmt: skip
    cost = run_cost("r", sorted(evs, key=lambda e: e.time), GPUS * 2)
    summary = summarize("r", "succeeded", rows, sorted(evs, key=lambda e: e.time), cost,
                        max_steps=700, restarts=0, kind="script",
                        spending=spending(cost, PRICES, None))  # fmt: skip
    assert (summary["steps"], summary["steps_lost"]) == (700, 0), summary
