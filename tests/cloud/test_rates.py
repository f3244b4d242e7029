"""The preemption rate `checkpoint.auto` weighs, from the cluster's ``node_lifecycle_events``.

First on API records built by hand (exact figures: the 72 h window, an event aged out, a notice
ending a node's exposure, the Gamma-Poisson posterior); then on the real emulator over HTTP, the
official SDK reading a capacity trace's withdrawal, and what launch makes of it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb import prelaunch
from tgnb.cloud import ClusterState
from tgnb.cloud.rates import estimate
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import NODE_ADDED, PREEMPTED, PREEMPTION_NOTIFIED, SCALED_DOWN, parse_time
from tgnb.runs.trainconfig import from_dict

from .conftest import _cluster_record, _preemptible_node
from .test_emulator_integration import make_cloud

NOW = parse_time("2026-11-29T20:00:00Z")


def ev(node: str, reason: str, at: str) -> dict[str, Any]:
    return {"node_id": node, "reason": reason, "message": "", "timestamp": at}


def state(events: list[dict[str, Any]], live: list[dict[str, Any]], **over: Any) -> ClusterState:
    base = _cluster_record(node_lifecycle_events=events, **over)
    base["gpu_worker_nodes"] = base["gpu_worker_nodes"] + live
    return ClusterState.from_api(base)


def test_node_hours_and_preemptions_from_the_events() -> None:
    p = "gpu-preemptible-dp-"
    s = state(
        [
            ev(p + "0", NODE_ADDED, "2026-11-29T10:00:00Z"),  # 4 h, then preempted
            ev(p + "0", PREEMPTION_NOTIFIED, "2026-11-29T14:00:00Z"),
            ev(p + "0", PREEMPTED, "2026-11-29T14:05:00Z"),
            ev(p + "1", NODE_ADDED, "2026-11-29T12:00:00Z"),  # 2 h, scaled down: no preemption
            ev(p + "1", SCALED_DOWN, "2026-11-29T14:00:00Z"),
            ev(p + "2", NODE_ADDED, "2026-11-29T16:00:00Z"),  # live: 4 h up to now
            ev("gpu-dp-0", NODE_ADDED, "2026-11-29T10:00:00Z"),  # standard: not counted
        ],
        [_preemptible_node(2)],
    )
    rate = estimate(s, prior=0.5, now=NOW)
    assert rate.preemptions == 1
    assert rate.node_hours == pytest.approx(10.0)
    assert rate.observed == pytest.approx(0.1)
    assert rate.per_node_hour == pytest.approx((0.5 * 1 + 1) / (1 + 10))  # Gamma-Poisson mean
    assert "0.136 preemptions per node-hour (0.1 observed: 1 over 10.0 node-hours" in str(rate)
    assert "prior 0.5 as 1 node-hour" in str(rate)


def test_nothing_observed_leaves_the_prior_and_the_window_is_72_hours() -> None:
    assert estimate(state([], []), prior=0.7, now=NOW).per_node_hour == pytest.approx(0.7)
    # a node live for 100 h whose NodeAdded aged out: exposed over the 72 h kept, not 100
    node = _preemptible_node(0)
    node["phase_transitions"] = [
        {"phase": "NODE_PHASE_RUNNING", "transition_time": "2026-11-25T12:00:00Z"}
    ]
    s = state(
        [ev("gpu-preemptible-dp-9", PREEMPTION_NOTIFIED, "2026-11-25T10:00:00Z")],  # 82 h ago
        [node],
        phase_transitions=[
            {"phase": "CLUSTER_PHASE_READY", "transition_time": "2026-11-20T00:00:00Z"}
        ],
    )
    rate = estimate(s, prior=1.0, now=NOW)
    assert rate.node_hours == pytest.approx(72.0) and rate.preemptions == 0
    # the record builder's cluster is younger (READY at 10:00): its window starts there
    young = estimate(state([], [node]), prior=1.0, now=NOW, retention=timedelta(hours=72))
    assert young.node_hours == pytest.approx(10.0)  # since the cluster's first phase, 10:00


def test_launch_sets_the_runs_rate_from_the_observed_one_the_setting_the_prior() -> None:
    p = "gpu-preemptible-dp-"
    events = [ev(p + "0", NODE_ADDED, "2026-11-29T17:00:00Z")]
    events += [ev(p + "0", PREEMPTION_NOTIFIED, "2026-11-29T19:00:00Z")]
    s = state(events, [])
    off = from_dict({"algorithm": "grpo", "checkpoint": {"every_steps": 5}})
    assert prelaunch.observed_preemption_rate(off, s, 1, NOW) == (off, None)  # auto off
    given = from_dict({"checkpoint": {"auto": True, "preemptions_per_hour": 1.0}})
    train, line = prelaunch.observed_preemption_rate(given, s, 2, NOW)
    per_node = (0.5 * 1 + 1) / (1 + 2)  # prior: the run's 1/h spread over its 2 nodes
    assert train.checkpoint.observed_preemptions_per_hour == pytest.approx(2 * per_node)
    assert train.checkpoint.preemptions_per_hour == 1.0  # the setting stays, the prior
    assert train.checkpoint.preemptions_source == line and line
    assert given.checkpoint.observed_preemptions_per_hour is None  # the given config unchanged
    assert "1 over 2.0 node-hours" in line and "x 2 nodes = 1 per hour of the run" in line
    assert "setting 1 per hour" in line and "cluster train" in line


def test_the_rate_of_a_trace_withdrawal_on_the_emulator_over_http(
    emulator: EmulatorHandle,
) -> None:
    """A capacity trace withdraws one of two nodes; the SDK's events give one preemption."""
    cloud = make_cloud(emulator)
    cluster = cloud.create("rates", preemptible=16)
    assert cluster.wait_for_capacity(timeout=60, poll=0.1).reached
    emulator.set_capacity_trace(
        [{"at_s": 0, "gpus": 16}, {"at_s": 100, "gpus": 8}], cluster_id=cluster.id
    )
    wait_until(lambda: PREEMPTION_NOTIFIED in {e.reason for e in cluster.events()}, timeout=30)
    snap = cluster.state()
    rate = cluster.preemption_rate(0.5, snap)
    nodes = [n for n in emulator.nodes(cluster.id) if n["kind"] == "preemptible"]
    exposed = 0.0
    for n in nodes:
        start = parse_time(n["ready_at"])
        end = parse_time(n["notified_at"]) if n["notified_at"] else snap.fetched_at
        exposed += (end - start).total_seconds() / 3600
    assert rate.preemptions == 1
    assert rate.node_hours == pytest.approx(exposed, abs=2 / 3600)  # within the read's seconds
    assert rate.per_node_hour == pytest.approx((0.5 + 1) / (1 + rate.node_hours))
    train = from_dict({"checkpoint": {"auto": True, "preemptions_per_hour": 0.5}})
    line = prelaunch.observed_preemption_rate(train, snap, 1)[1]
    assert line and "1 over 0.0 node-hours" in line and "prior 0.5" in line
    cloud.close()
