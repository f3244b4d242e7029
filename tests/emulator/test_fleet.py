"""The fleet's rules on a controlled clock (no HTTP): schedules, de-duplication, retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.fleet import Fleet, FleetConfig
from tgnb.emulator.store import StateStore
from tgnb.emulator.validation import RequestError, validate_create
from tgnb.events import parse_time

from .conftest import SEED_CREATE


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def make(tmp_path: Path, **cfg: Any) -> tuple[Fleet, Clock]:
    clock = Clock()
    return Fleet(FleetConfig(**cfg), StateStore(tmp_path / "state"), clock=clock), clock


def body(**kw: Any) -> dict[str, Any]:
    return validate_create({**SEED_CREATE, "project_id": "p", **kw})


def run_until(fleet: Fleet, clock: Clock, end: float, step: float = 1.0) -> None:
    while clock.t < end:
        clock.t += step
        fleet.advance()


def test_nodes_arrive_one_provisioning_delay_apart(tmp_path: Path) -> None:
    fleet, clock = make(tmp_path, provision_delay_s=60)
    cid = fleet.create(body(num_preemptible_gpus=16))["cluster_id"]
    start = clock.t
    seen = []
    while fleet.retrieve(cid)["allocated_preemptible_gpus"] < 16:
        clock.t += 1
        seen.append((clock.t - start, fleet.retrieve(cid)["allocated_preemptible_gpus"]))
    assert next(s for s, a in seen if a == 8) == 60
    assert seen[-1] == (120, 16)


def test_random_preemptions_follow_the_seed(tmp_path: Path) -> None:
    def schedule(seed: int, root: Path) -> list[tuple[str, str, float]]:
        fleet, clock = make(root, provision_delay_s=60, preemption_rate=2.0, seed=seed)
        cid = fleet.create(body(num_preemptible_gpus=16))["cluster_id"]
        t0 = clock.t
        run_until(fleet, clock, t0 + 3 * 3600, step=30)
        events = fleet.retrieve(cid)["node_lifecycle_events"]
        return [
            (
                e["node_id"].rsplit("-", 1)[1],
                e["reason"],
                parse_time(e["timestamp"]).timestamp() - t0,
            )
            for e in events
            if "preemptible" in e["node_id"]
        ]

    a = schedule(3, tmp_path / "a")
    b = schedule(3, tmp_path / "b")
    c = schedule(4, tmp_path / "c")
    reasons = [r for _, r, _ in a]
    assert reasons.count("TogetherPreemptionNotified") >= 2  # rate 2/node-hour over 3 h, 2 nodes
    assert a == b  # the same seed, the same story, at the same times
    assert a != c


def test_events_are_deduplicated_and_expire_after_72h(tmp_path: Path) -> None:
    fleet, clock = make(tmp_path, provision_delay_s=60, drain_window_s=300)
    cid = fleet.create(body(num_preemptible_gpus=8))["cluster_id"]
    run_until(fleet, clock, clock.t + 61)
    name = next(n["name"] for n in fleet.nodes(cid) if n["kind"] == "preemptible")
    fleet.preempt(cid, name)
    cluster = fleet.clusters[cid]
    fleet.lifecycle.event(cluster, name, "TogetherPreemptionNotified", "again", clock.t + 1)
    events = fleet.retrieve(cid)["node_lifecycle_events"]
    keys = [(e["node_id"], e["reason"]) for e in events]
    assert len(keys) == len(set(keys))
    run_until(fleet, clock, clock.t + 301)
    assert any(
        e["reason"] == "TogetherPreempted" for e in fleet.retrieve(cid)["node_lifecycle_events"]
    )
    clock.t += 72 * 3600 + 400
    fleet.advance()
    got = fleet.retrieve(cid)
    assert all(e["node_id"] != name for e in got["node_lifecycle_events"])
    assert all(n["node_id"] != name for n in got["deleted_gpu_worker_nodes"])


def test_time_scale_compresses_every_duration(tmp_path: Path) -> None:
    fleet, clock = make(tmp_path, time_scale=0.02, provision_delay_s=60, drain_window_s=300)
    cid = fleet.create(body(num_preemptible_gpus=8))["cluster_id"]
    run_until(fleet, clock, clock.t + 1.2, step=0.1)  # 60 s x 0.02
    assert fleet.retrieve(cid)["allocated_preemptible_gpus"] == 8
    node = fleet.preempt(cid)
    assert node["deadline_unix"] - clock.t == pytest.approx(6.0)  # 300 s x 0.02


def test_admin_preempt_refuses_what_cannot_be_preempted(tmp_path: Path) -> None:
    fleet, _ = make(tmp_path)
    cid = fleet.create(body(num_preemptible_gpus=0))["cluster_id"]
    with pytest.raises(RequestError) as info:
        fleet.preempt(cid)
    assert info.value.status == 409
    standard = fleet.nodes(cid)[0]["name"]
    with pytest.raises(RequestError) as info:
        fleet.preempt(cid, standard)
    assert info.value.status == 400
    with pytest.raises(RequestError) as info:
        fleet.preempt(cid, "gpu-preemptible-dp-nope-0")
    assert info.value.status == 404


def test_standard_nodes_follow_num_gpus_synchronously(tmp_path: Path) -> None:
    fleet, _ = make(tmp_path)
    cid = fleet.create(body(num_gpus=16))["cluster_id"]
    assert [n["status"] for n in fleet.retrieve(cid)["gpu_worker_nodes"]] == ["Ready", "Ready"]
    after = fleet.update(cid, {"num_gpus": 8})
    assert len(after["gpu_worker_nodes"]) == 1 and after["num_gpus"] == 8
    assert [e["reason"] for e in after["node_lifecycle_events"]][-1] == "TogetherScaledDown"


def test_a_draining_node_can_be_released_before_its_deadline(tmp_path: Path) -> None:
    fleet, clock = make(tmp_path, provision_delay_s=60, drain_window_s=300)
    cid = fleet.create(body(num_preemptible_gpus=8))["cluster_id"]
    run_until(fleet, clock, clock.t + 61)
    node = fleet.preempt(cid)
    clock.t += 30
    released = fleet.release(cid, node["name"])
    assert released["state"] == "removed" and released["removed_reason"] == "TogetherPreempted"
    assert fleet.clusters[cid].node(node["name"]).removed_at == clock.t  # type: ignore[union-attr]
    assert any(n["state"] == "provisioning" for n in fleet.nodes(cid))  # replacement on its way
    with pytest.raises(RequestError):
        fleet.release(cid, node["name"])
