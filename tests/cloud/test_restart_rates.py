"""The rate `checkpoint.auto` weighs, updated at a restart, on records built by hand (exact
figures). The local engine's supervisor re-reads the cluster (`tgnb.cloud.rates.apply` at a restart);
the nodes of Slurm and Kubernetes, which hold no API key, fold the run's own events into the
launch's estimate (`tgnb.train.rates.at_restart`). Both work on the config as the launch wrote it
(`tgnb.cloud.rates.apply`), read back as the runtime reads it (`tgnb.tasks.config.from_dict`)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from tgnb.cloud import ClusterState
from tgnb.cloud.rates import apply
from tgnb.errors import TrainConfigError
from tgnb.events import (
    NODE_ADDED,
    PREEMPTION_NOTIFIED,
    RUN_STARTED,
    SIGNAL_RECEIVED,
    Event,
    parse_time,
)
from tgnb.runs.node import render_config
from tgnb.runs.policy import CheckpointPolicy
from tgnb.runs.trainconfig import TrainConfig
from tgnb.tasks import config
from tgnb.train import rates as node_rates

from .conftest import _cluster_record

NOW = parse_time("2026-11-29T20:00:00Z")
P = "gpu-preemptible-dp-"


def cluster(events: list[tuple[str, str, str]]) -> ClusterState:
    raw = [{"node_id": n, "reason": r, "message": "", "timestamp": t} for n, r, t in events]
    return ClusterState.from_api(_cluster_record(node_lifecycle_events=raw))


def launched(nodes: int = 2) -> TrainConfig:
    """A run launched at NOW on `nodes` nodes of a cluster that saw 1 preemption in 10
    node-hours (two nodes from 10:00, one notified at 15:00, the other scaled down at 15:00)."""
    state = cluster(
        [
            (P + "0", NODE_ADDED, "2026-11-29T10:00:00Z"),
            (P + "0", PREEMPTION_NOTIFIED, "2026-11-29T15:00:00Z"),
            (P + "1", NODE_ADDED, "2026-11-29T10:00:00Z"),
            (P + "1", "TogetherScaledDown", "2026-11-29T15:00:00Z"),
        ]
    )
    train, line = apply(config.from_dict({"checkpoint": {"auto": True}}), state, nodes, NOW)
    assert line
    return train


def test_launch_leaves_the_estimates_weight_and_time_for_a_restart() -> None:
    ck = launched(nodes=2).checkpoint
    per_node = (0.5 * 1 + 1) / (1 + 10)  # the setting 1/h spread over 2 nodes as the prior
    assert ck.observed_preemptions_per_hour == pytest.approx(2 * per_node)
    assert ck.preemptions_weight_hours == pytest.approx((1 + 10) / 2)  # hours of the run
    assert ck.preemptions_as_of == "2026-11-29T20:00:00Z"
    written = yaml.safe_load(render_config(launched().compact()))  # the node's config file
    policy = config.from_dict(written).checkpoint  # what the node reads: accepted
    assert policy.preemptions_weight_hours == pytest.approx(5.5)
    for bad in (0, -1.0, "5", True, float("nan")):
        with pytest.raises(TrainConfigError, match="preemptions_weight_hours must be a number"):
            CheckpointPolicy(auto=True, preemptions_weight_hours=bad)  # checks itself
    with pytest.raises(TrainConfigError, match="preemptions_as_of must be text"):
        CheckpointPolicy(preemptions_as_of=5)  # type: ignore[arg-type]


def test_the_local_restart_reads_the_cluster_again_with_its_new_preemption() -> None:
    train = launched(nodes=1)
    before = train.checkpoint.observed_preemptions_per_hour
    state = cluster(
        [
            (P + "0", NODE_ADDED, "2026-11-29T10:00:00Z"),
            (P + "0", PREEMPTION_NOTIFIED, "2026-11-29T15:00:00Z"),
            (P + "1", NODE_ADDED, "2026-11-29T10:00:00Z"),
            (P + "1", "TogetherScaledDown", "2026-11-29T15:00:00Z"),
            (P + "2", NODE_ADDED, "2026-11-29T20:00:00Z"),  # the run's node, preempted soon
            (P + "2", PREEMPTION_NOTIFIED, "2026-11-29T20:30:00Z"),
        ]
    )
    again, line = apply(train, state, 1, NOW + timedelta(hours=1), restart=1)
    ck = again.checkpoint
    assert line is not None and line == ck.preemptions_source
    assert line.startswith("checkpoint.auto weighs (the cluster re-read at restart 1) ")
    assert ": 2 over " in line
    assert ck.observed_preemptions_per_hour is not None and before is not None
    assert ck.observed_preemptions_per_hour > before
    assert ck.preemptions_per_hour == train.checkpoint.preemptions_per_hour  # the prior stays
    assert ck.preemptions_as_of == "2026-11-29T21:00:00Z"  # read then, not at the launch
    off = config.from_dict({"checkpoint": {"every_steps": 5}})
    assert apply(off, state, 1, restart=1) == (off, None)


def test_after_a_local_re_read_the_runtime_adds_nothing(tmp_path: Path) -> None:
    """The supervisor's estimate is newer than every attempt: the node keeps it as written."""
    train = launched(nodes=1)
    started = Event(NOW + timedelta(minutes=5), "run", RUN_STARTED, "", run="r", data={"pid": 1})
    stopped = Event(NOW + timedelta(minutes=35), "run", SIGNAL_RECEIVED, "", run="r")
    (tmp_path / "events.jsonl").write_text(started.to_json() + "\n" + stopped.to_json() + "\n")
    policy = train.checkpoint
    assert (
        node_rates.at_restart(policy, tmp_path, 1).preemptions_source != policy.preemptions_source
    )
    train = apply(train, cluster([]), 1, NOW + timedelta(hours=1), restart=1)[0]  # supervisor's
    policy = train.checkpoint
    assert node_rates.at_restart(policy, tmp_path, 1) is policy
