"""The recovery policy (`tgnb.runs.recovery`): the decision table, the budget and the validation.
Pure functions: nothing is faked."""

from __future__ import annotations

import pytest

from tgnb.errors import ValidationError
from tgnb.runs.node import Exit
from tgnb.runs.recovery import Facts, RecoveryPolicy, decide
from tgnb.runs.spec import Resources, RunSpec


def facts(pre: int, std: int = 1, short: float = 0.0, **kw: object) -> Facts:
    base: dict[str, object] = dict(
        nodes=2, min_nodes=1, free={"preemptible": pre, "standard": std}, short_for_s=short,
        allocated_gpus=8 * pre, desired_gpus=16,
    )  # fmt: skip
    base.update(kw)
    return Facts(**base)  # type: ignore[arg-type]


def test_full_capacity_starts_on_preemptible_for_every_policy() -> None:
    for when in ("wait", "shrink", "standard"):
        d = decide(RecoveryPolicy(when_short=when), facts(2))
        assert (d.action, d.nodes, d.node_class, d.rule) == ("start", 2, "preemptible", "full")


def test_wait_waits_and_says_why() -> None:
    d = decide(RecoveryPolicy(), facts(1, short=600))
    assert (d.action, d.node_class) == ("wait", "preemptible")
    assert (
        d.reason == "waiting for 2 preemptible nodes: 8 of 16 preemptible GPUs allocated for 10 min"
    )


def test_shrink_takes_what_is_free_down_to_min_nodes() -> None:
    d = decide(RecoveryPolicy(when_short="shrink"), facts(1, short=600))
    assert (d.action, d.nodes, d.node_class, d.rule) == ("start", 1, "preemptible", "shrink")
    assert d.reason == "shrunk to 1 node: 8 of 16 preemptible GPUs allocated for 10 min"
    assert decide(RecoveryPolicy(when_short="shrink"), facts(0)).action == "wait"
    assert decide(RecoveryPolicy(when_short="shrink"), facts(1, short=599)).action == "wait"


def test_standard_moves_only_after_wait_s_and_back_when_capacity_returns() -> None:
    p = RecoveryPolicy(when_short="standard", wait_s=60)
    assert decide(p, facts(1, short=59)).action == "wait"
    d = decide(p, facts(1, std=2, short=60))
    assert (d.action, d.nodes, d.node_class, d.rule) == ("start", 2, "standard", "standard")
    assert d.reason == "moved to 2 standard nodes: 8 of 16 preemptible GPUs allocated for 60 s"
    d = decide(p, facts(1, std=1, short=600))  # min_nodes=1: it may run smaller on standard too
    assert (d.action, d.nodes, d.node_class) == ("start", 1, "standard")
    assert decide(p, facts(1, std=1, short=600, min_nodes=None)).action == "wait"
    assert decide(p, facts(2, std=2, short=600)).node_class == "preemptible"  # back at next start


def test_deadline_uniform_progress() -> None:
    """On track: preemptible (and wait when short). Behind the uniform-progress line, or out of
    slack: standard. Back on track: preemptible again."""
    p = RecoveryPolicy(deadline=1000.0)
    on_track = dict(started=0.0, now=500.0, steps_total=100, steps_done=50, step_s=1.0)
    assert decide(p, facts(0, std=2, **on_track)).action == "wait"
    behind = dict(on_track, steps_done=40)
    d = decide(p, facts(0, std=2, **behind))
    assert (d.action, d.node_class, d.rule) == ("start", "standard", "deadline")
    assert "behind uniform progress: step 40 of 100, 50 due by now" in d.reason
    assert decide(p, facts(2, std=2, **behind)).node_class == "standard"  # behind: pay to catch up
    no_slack = dict(started=0.0, now=900.0, steps_total=100, steps_done=95, step_s=10.0)
    assert decide(p, facts(2, std=2, **no_slack)).reason.startswith(
        "moved to standard: slack ran out"
    )
    ahead = dict(on_track, steps_done=60)
    assert decide(p, facts(2, std=2, **ahead)).node_class == "preemptible"


def test_budget_counts_failures_not_preemptions() -> None:
    p = RecoveryPolicy(max_restarts=2, backoff_s=10, backoff_max_s=25)
    assert p.is_resume(Exit.PREEMPTED) and not p.is_resume(1) and not p.is_resume(None)
    assert p.restart_after_failure(1, 1) and p.restart_after_failure(2, 1)
    assert not p.restart_after_failure(3, 1)
    assert not p.restart_after_failure(1, Exit.BAD_CONFIG)  # a restart cannot fix these
    assert not p.restart_after_failure(1, Exit.NO_SPACE)
    assert [p.backoff(n) for n in (0, 1, 2, 3, 4)] == [0.0, 10.0, 20.0, 25.0, 25.0]


@pytest.mark.parametrize(
    ("policy", "resources", "fix"),
    [
        (RecoveryPolicy(max_restarts=-1), Resources(), "max_restarts must be an integer from 0"),
        (RecoveryPolicy(max_restarts=True), Resources(), "max_restarts must be an integer"),
        (RecoveryPolicy(backoff_s=-1), Resources(), "backoff_s must be a number of seconds >= 0"),
        (RecoveryPolicy(backoff_s=10, backoff_max_s=5), Resources(), "raise backoff_max_s"),
        (RecoveryPolicy(wait_s=float("nan")), Resources(), "wait_s must be a number"),
        (RecoveryPolicy(resume_codes=(0,)), Resources(), "resume_codes must be a tuple"),
        (RecoveryPolicy(resume_codes=[75]), Resources(), "resume_codes must be a tuple"),  # type: ignore[arg-type]
        (RecoveryPolicy(when_short="grow"), Resources(), "when_short must be one of wait, shrink"),
        (RecoveryPolicy(when_short="shrink"), Resources(nodes=2), "pass a min_nodes below nodes"),
        (RecoveryPolicy(when_short="standard"), Resources(preemptible=False), "preemptible=True"),
        (RecoveryPolicy(deadline=-5), Resources(), "deadline must be a POSIX time"),
    ],
)
def test_bad_policies_are_refused_with_the_fix(
    policy: RecoveryPolicy, resources: Resources, fix: str
) -> None:
    with pytest.raises(ValidationError, match=fix) as info:
        RunSpec("r", {}, resources=resources, recovery=policy).validate()
    assert "\n" not in str(info.value)


def test_the_default_is_todays_behaviour_and_round_trips() -> None:
    assert RunSpec("r", {}).policy == RecoveryPolicy()
    elastic = RunSpec("r", {}, Resources(nodes=2, min_nodes=1)).policy  # --nodes=MIN-MAX, at once
    assert (elastic.when_short, elastic.wait_s) == ("shrink", 0.0)
    spec = RunSpec("r", {}, Resources(nodes=2, min_nodes=1),
                   recovery=RecoveryPolicy(when_short="standard", resume_codes=(75, 76)))  # fmt: skip
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert RunSpec.from_dict(RunSpec("r", {}).to_dict()) == RunSpec("r", {})


def test_coerce() -> None:
    assert RecoveryPolicy.coerce("shrink") == RecoveryPolicy(when_short="shrink")
    assert RecoveryPolicy.coerce({"max_restarts": 1}) == RecoveryPolicy(max_restarts=1)
    with pytest.raises(ValidationError, match="recovery has no field 'retries'"):
        RecoveryPolicy.coerce({"retries": 1})
