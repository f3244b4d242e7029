"""The placement loop (`tgnb.runs.placing`): observe, decide, act, record once per decision; and
the failure backoff every engine renders.

`Cluster` below is the `Engine` protocol's test double, not a mock of tgnb's code: it is what an
engine is (facts it sees, a record of what it did), written out in a few lines so the loop's
rules are tested alone. The decisions are the real `tgnb.runs.recovery.decide`'s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tgnb.runs.placing import (
    NoAnswer,
    PlacementLoop,
    backoff_table,
    delay,
    main,
    seconds,
    wait_backoff,
)
from tgnb.runs.recovery import Decision, Facts, RecoveryPolicy, decide


class Cluster:
    """An engine whose free nodes the test sets; a start it carries out only while `claimable`."""

    def __init__(self, pre: int = 0, std: int = 0) -> None:
        self.free = {"preemptible": pre, "standard": std}
        self.short_for = 0.0
        self.waiting = True  # something waits for a placement
        self.claimable = True
        self.acted: list[Decision] = []
        self.recorded: list[Decision] = []

    def observe(self) -> Facts | None:
        if not self.waiting:
            return None
        return Facts(nodes=2, min_nodes=1, free=dict(self.free), short_for_s=self.short_for)

    def act(self, decision: Decision) -> Decision:
        self.acted.append(decision)
        if decision.action == "start" and not self.claimable:
            return dataclasses.replace(decision, action="wait", reason="held by another run")
        return decision

    def record(self, decision: Decision) -> None:
        self.recorded.append(decision)

    def done(self) -> bool:
        return any(d.action == "start" for d in self.recorded)


def test_a_wait_is_recorded_once_and_again_when_its_rule_changes() -> None:
    cluster = Cluster(pre=1, std=2)
    placer = PlacementLoop(RecoveryPolicy(when_short="standard", wait_s=60), cluster)
    for short in (0.0, 10.0, 30.0):  # the reason's minutes change, the decision does not
        cluster.short_for = short
        d = placer.step()
        assert d is not None and d.action == "wait"
    assert len(cluster.acted) == 3 and [d.rule for d in cluster.recorded] == ["wait"]
    cluster.short_for = 60.0
    d = placer.step()
    assert d is not None and (d.action, d.node_class, d.rule) == ("start", "standard", "standard")
    assert [d.rule for d in cluster.recorded] == ["wait", "standard"]


def test_the_decision_recorded_is_the_one_carried_out() -> None:
    cluster = Cluster(pre=2)
    cluster.claimable = False
    placer = PlacementLoop(RecoveryPolicy(), cluster)
    d = placer.step()
    assert d is not None and (d.action, d.reason) == ("wait", "held by another run")
    assert cluster.acted[0].action == "start"
    assert [r.action for r in cluster.recorded] == ["wait"]
    cluster.claimable = True
    placer.step()
    assert [r.action for r in cluster.recorded] == ["wait", "start"]


def test_nothing_to_place_ends_the_placement_and_the_next_decision_is_recorded() -> None:
    cluster = Cluster(pre=2)
    placer = PlacementLoop(RecoveryPolicy(), cluster)
    placer.step()
    placer.step()  # the same start again (the job has not started yet): not recorded again
    assert len(cluster.recorded) == 1
    cluster.waiting = False
    assert placer.step() is None
    assert len(cluster.acted) == 2 and len(cluster.recorded) == 1
    cluster.waiting = True  # the next restart: a new placement
    placer.step()
    assert len(cluster.recorded) == 2


def test_the_loop_steps_a_poll_apart_until_the_engine_is_done() -> None:
    """`PlacementLoop.run`: waits (recorded once), a look that got no answer (nothing recorded, the
    loop goes on), then a start ends it with no sleep after it."""
    cluster = Cluster(pre=0)
    looks: list[str] = []
    observe = cluster.observe

    def look() -> Facts | None:
        looks.append("look")
        if len(looks) == 2:
            raise NoAnswer
        if len(looks) == 4:
            cluster.free["preemptible"] = 2
        return observe()

    cluster.observe = look  # type: ignore[method-assign]
    slept: list[float] = []
    PlacementLoop(RecoveryPolicy(), cluster).run(5.0, sleep=slept.append)
    assert len(looks) == 4 and slept == [5.0, 5.0, 5.0]
    assert [(d.action, d.rule) for d in cluster.recorded] == [("wait", "wait"), ("start", "full")]


def running(pre: int, std: int, current: str = "standard", **kw: object) -> Facts:
    return Facts(nodes=2, free={"preemptible": pre, "standard": std}, current=current, **kw)  # type: ignore[arg-type]


def test_a_run_on_standard_nodes_goes_back_as_soon_as_it_would_start_on_preemptible() -> None:
    """The move back is `decide`'s rule on every engine: a run that runs on standard nodes
    (`Facts.current`) goes back when its placement now would start on preemptible nodes;
    otherwise it keeps its nodes, and a keep is never recorded."""
    policy = RecoveryPolicy(when_short="standard", wait_s=60)
    d = decide(policy, running(pre=2, std=0))
    assert (d.action, d.nodes, d.node_class, d.rule) == ("start", 2, "preemptible", "full")
    assert d.reason == "back to preemptible: on 2 preemptible nodes"
    for f in (
        running(pre=1, std=2),  # not enough preemptible capacity yet
        running(pre=2, std=2, current="preemptible"),  # already there
        running(pre=2, std=2, preemptible=False),  # it asked for standard nodes
    ):
        assert decide(policy, f).action == "keep", f
    # a deadline at risk keeps it on standard nodes, whatever preemptible capacity is free
    late = dict(started=0.0, now=50.0, steps_done=1, steps_total=100, step_s=10.0)
    assert decide(RecoveryPolicy(deadline=100.0), running(2, 2, **late)).action == "keep"


class OnStandard(Cluster):
    """A run on standard nodes, its facts those of a running attempt."""

    def observe(self) -> Facts | None:
        return running(self.free["preemptible"], self.free["standard"])


def test_a_keep_is_neither_recorded_nor_ends_a_placement() -> None:
    cluster = OnStandard(pre=0, std=2)
    loop = PlacementLoop(RecoveryPolicy(when_short="standard"), cluster)
    assert [loop.step().action for _ in range(3)] == ["keep"] * 3  # type: ignore[union-attr]
    assert cluster.recorded == []
    cluster.free["preemptible"] = 2
    d = loop.step()
    assert d is not None and d.reason.startswith("back to preemptible")
    assert [r.reason for r in cluster.recorded] == [d.reason]


def test_the_backoff_table_is_the_policys_delay_for_each_failure() -> None:
    policy = RecoveryPolicy(max_restarts=10, backoff_s=5, backoff_max_s=30)
    table = backoff_table(policy)
    assert table == (5.0, 10.0, 20.0, 30.0)
    for failures in range(0, 12):
        assert delay(table, failures) == policy.backoff(failures)
    assert backoff_table(RecoveryPolicy(max_restarts=2, backoff_s=1)) == (1.0, 2.0)
    assert backoff_table(RecoveryPolicy(max_restarts=0)) == ()
    assert backoff_table(RecoveryPolicy(max_restarts=10_000, backoff_s=0)) == (0.0,)
    assert [seconds(x) for x in (5.0, 2.5, 0.0, 0.0004)] == ["5", "2.5", "0", "0"]


def test_the_backoff_command_sleeps_the_delay_of_the_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["backoff", "", "5,10"]) == 0  # the first pod: no count yet, no wait
    assert main(["backoff", "0", "5,10"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["backoff", "3", "0.001,0.002"]) == 0
    assert "failure 3 counted: restarting in 0.002 s" in capsys.readouterr().out
    for bad in (["backoff", "x", "5"], ["backoff", "1", "five"], ["sleep", "1", "5"]):
        assert main(bad) == 2
    assert "usage: python -m tgnb.runs.placing backoff" in capsys.readouterr().err


def test_a_count_already_waited_for_is_not_waited_again(tmp_path: Path) -> None:
    """A pod started again after a preemption keeps its index's failure count: no second wait."""
    done = tmp_path / ".tgnb-backoff-0"
    assert wait_backoff((0.001, 0.002), 0, done) == 0 and not done.exists()
    assert wait_backoff((0.001, 0.002), 1, done) == 0.001 and done.read_text() == "1\n"
    assert wait_backoff((0.001, 0.002), 1, done) == 0  # preempted since: the same count
    assert main(["backoff", "2", "0.001,0.002", str(done)]) == 0
    assert done.read_text() == "2\n"
    done.write_text("")  # half-written: waited for nothing yet
    assert wait_backoff((0.001, 0.002), 2, done) == 0.002
