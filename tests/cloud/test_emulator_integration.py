"""The facade against the real emulator: the official SDK over real HTTP on 127.0.0.1.

Nothing is faked: the `emulator` fixture (tests/conftest.py) runs the emulator daemon with time
compressed 100x (drain window 3 s, a node provisions in 0.6 s). The emulator's request log shows
exactly which requests reached the API.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb import errors
from tgnb.cloud import Cloud, ClusterState, RetryPolicy
from tgnb.config import Secret, Settings
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import NODE_ADDED, PREEMPTED, PREEMPTION_NOTIFIED

MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def make_cloud(emu: EmulatorHandle, *, project: bool = True, **kw: Any) -> Cloud:
    settings = Settings(
        api_key=Secret(emu.api_key),
        base_url=emu.base_url,
        project_id=emu.project_id if project else None,
        home=emu.home,
    )
    kw.setdefault("timeout", 10.0)
    return Cloud(settings, **kw)


def mutating(emu: EmulatorHandle) -> list[dict[str, Any]]:
    return [r for r in emu.requests() if r["method"] in MUTATING]


def test_attach_by_id_and_name(emulator: EmulatorHandle) -> None:
    cloud = Cloud.from_env(emulator.env, timeout=10.0)  # configuration read in one place
    assert cloud.project_id == emulator.project_id and emulator.api_key not in repr(cloud)
    made = cloud.create("train", preemptible=8)
    cloud.create("other")
    emulator.clear_requests()
    by_id = cloud.attach(made.id)
    by_name = cloud.attach("train")
    assert by_id.id == by_name.id == made.id
    state = by_name.state()
    assert isinstance(state, ClusterState)
    assert (state.name, state.type, state.num_gpus, state.desired_preemptible_gpus) == (
        "train",
        "KUBERNETES",
        8,
        8,
    )
    assert [n.name.startswith("gpu-dp") for n in state.standard_nodes] == [True]
    assert "kube_config" not in repr(state) and "<table>" in state._repr_html_()
    assert mutating(emulator) == []
    assert [c.name for c in cloud.clusters()] == ["train", "other"]
    cloud.close()


def test_scale_then_wait_reaches_the_target(emulator: EmulatorHandle) -> None:
    cloud = make_cloud(emulator)
    cluster = cloud.create("train")
    emulator.clear_requests()
    state = cluster.scale(preemptible=16)
    assert state.desired_preemptible_gpus == 16
    puts = mutating(emulator)
    assert [(r["method"], r["body"]) for r in puts] == [("PUT", {"num_preemptible_gpus": 16})]
    seen: list[ClusterState] = []
    result = cluster.wait_for_capacity(timeout=60, poll=0.1, callback=seen.append)
    assert result.reached
    assert result.state.allocated_preemptible_gpus == 16
    assert len(result.state.preemptible_nodes) == 2
    allocated = [s.allocated_preemptible_gpus for s in seen]
    assert allocated == sorted(allocated) and allocated[-1] == 16
    assert len(seen) == result.polls


def test_wait_returns_cleanly_when_capacity_stays_short(emulator: EmulatorHandle) -> None:
    cloud = make_cloud(emulator)
    cluster = cloud.create("train")
    emulator.set_capacity(8, cluster.id)
    cluster.scale(preemptible=24)
    result = cluster.wait_for_capacity(timeout=2.5, poll=0.1)
    assert not result.reached
    assert result.state.desired_preemptible_gpus == 24
    assert result.state.allocated_preemptible_gpus <= 8
    assert "still short" in str(result)


def test_events_are_incremental_across_a_preemption(emulator: EmulatorHandle) -> None:
    cloud = make_cloud(emulator)
    cluster = cloud.create("train", preemptible=8)
    assert cluster.wait_for_capacity(timeout=60, poll=0.1).reached
    first = cluster.poll_events()
    assert NODE_ADDED in {e.reason for e in first}
    assert cluster.poll_events() == []
    victim = emulator.preempt(cluster.id)["name"]
    notified = cluster.poll_events()
    assert [(e.reason, e.node) for e in notified] == [(PREEMPTION_NOTIFIED, victim)]

    def removed_and_replaced() -> bool:
        reasons = [(e.reason, e.node) for e in cluster.events()]
        return (PREEMPTED, victim) in reasons and sum(r == NODE_ADDED for r, _ in reasons) >= 3

    wait_until(removed_and_replaced, timeout=60, every=0.1)
    later = cluster.poll_events()
    reasons = [e.reason for e in later]
    assert PREEMPTION_NOTIFIED not in reasons  # not handed out twice
    assert (PREEMPTED, victim) in [(e.reason, e.node) for e in later]
    added = [e for e in later if e.reason == NODE_ADDED]
    assert added and all(e.node != victim and e.time > notified[0].time for e in added)
    all_keys = [e.key for e in cluster.feed.history]
    assert len(all_keys) == len(set(all_keys))


def test_bad_input_sends_no_mutating_request(emulator: EmulatorHandle) -> None:
    """Bad targets send nothing at all; name look-ups send only reads (a list, a retrieve)."""
    cloud = make_cloud(emulator)
    cluster = cloud.create("train")
    cloud.create("twin")
    cloud.create("twin")
    emulator.clear_requests()

    for bad, fragment in [
        (12, "must be a multiple of 8, got 12: try 8 or 16"),
        (-8, "must be >= 0"),
        ("16", "not the string '16'"),
    ]:
        with pytest.raises(errors.ValidationError) as info:
            cluster.scale(preemptible=bad)  # type: ignore[arg-type]
        assert fragment in str(info.value) and "\n" not in str(info.value)
    no_project = make_cloud(emulator, project=False).attach(cluster.id)
    emulator.clear_requests()
    with pytest.raises(errors.ValidationError, match="needs a project"):
        no_project.scale(preemptible=16)
    assert emulator.requests() == []  # the target checks send nothing at all

    with pytest.raises(errors.NotFoundError) as nf:
        cloud.attach("no-such-cluster")
    assert "train" in str(nf.value) and "twin" in str(nf.value)
    with pytest.raises(errors.AmbiguousNameError) as amb:
        cloud.attach("twin")
    twins = [c.id for c in cloud.clusters() if c.name == "twin"]
    assert all(t in str(amb.value) for t in twins)
    for err in (nf.value, amb.value):
        assert "\n" not in str(err)
    log = emulator.requests()
    assert log and {r["method"] for r in log} == {"GET"}
    assert cloud.attach(cluster.id).state().desired_preemptible_gpus == 0


def test_wrong_key_is_refused_clearly_and_never_echoed(emulator: EmulatorHandle) -> None:
    wrong = "tgnb-wrong-key-" + "x7" * 12
    settings = Settings(
        api_key=Secret(wrong), base_url=emulator.base_url, project_id=emulator.project_id
    )
    cloud = Cloud(settings, timeout=10.0)
    emulator.clear_requests()
    with pytest.raises(errors.AuthenticationError) as info:
        cloud.attach("train")
    msg = str(info.value)
    assert "refused TOGETHER_API_KEY (401)" in msg and "check the key" in msg
    assert wrong not in msg and wrong not in repr(info.value)
    log = emulator.requests()
    assert [(r["method"], r["status"]) for r in log] == [("GET", 401)]
    assert wrong not in str(log)


@pytest.mark.slow
def test_chaos_30_percent_attach_scale_events_complete(emulator: EmulatorHandle) -> None:
    """A seeded 30 % of requests get 429, 503 or an answer later than the client's timeout.

    The delayed requests are still served by the emulator after the client gave up; the facade
    reads the cluster back before resending the target, so the emulator serves the PUT once.
    Seed 18 makes the emulator answer the first three PUTs with 503 and hold the fourth past the
    client's timeout (both recovery paths); the test checks the PUT was hit rather than trusting it.
    """
    setup = make_cloud(emulator)
    made = setup.create("train", preemptible=8)
    emulator.set_chaos(0.3, seed=18, delay_s=1.5, retry_after_ms=50)
    emulator.clear_requests()
    cloud = make_cloud(
        emulator,
        timeout=1.0,
        max_retries=2,
        retry=RetryPolicy(attempts=4, backoff=1.0, max_backoff=2.0),
    )
    cluster = cloud.attach("train")
    assert cluster.id == made.id
    state = cluster.scale(preemptible=16)
    assert state.desired_preemptible_gpus == 16
    result = cluster.wait_for_capacity(timeout=120, poll=0.2)
    assert result.reached
    emulator.preempt(cluster.id)
    got: list[str] = []

    def notified() -> bool:
        got.extend(e.reason for e in cluster.poll_events())
        return PREEMPTION_NOTIFIED in got

    wait_until(notified, 120, what="the preemption notice")
    assert got.count(PREEMPTION_NOTIFIED) == 1
    emulator.set_chaos(0.0)
    log = emulator.requests()
    assert any(r["chaos"] for r in log), "the seed should have hit some requests"
    puts = [r for r in log if r["method"] == "PUT"]
    assert {str(r["body"]) for r in puts} == {str({"num_preemptible_gpus": 16})}
    assert any(r["chaos"] for r in puts), f"seed 18 no longer hits the PUT: pick another ({puts})"
    served = [r for r in puts if r["status"] == 200]
    assert len(served) == 1, puts
    assert setup.attach(made.id).state().desired_preemptible_gpus == 16
