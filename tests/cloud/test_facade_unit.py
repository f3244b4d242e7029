"""`Cloud` and `Cluster` over the real SDK, with HTTP answered by an ``httpx.MockTransport``.

Only the outermost HTTP boundary is faked here (the integration tests in this folder use the real
emulator): the SDK builds, sends and parses every request, so these tests see the exact method,
path and JSON body tgnb sends, and that bad input sends nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tgnb import errors
from tgnb.cloud import ClusterState
from tgnb.events import PREEMPTION_NOTIFIED, TARGET_CHANGED


class FakeClusters:
    """A tiny in-memory clusters API behind the mock transport (only what these tests need)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = {r["cluster_id"]: r for r in records}
        self.fail_next: list[int] = []  # status codes to answer before serving normally
        self.apply_before_failing = False
        self.fail_method: str | None = None  # fail only requests with this method

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if self.fail_next and self.fail_method in (None, request.method):
            code = self.fail_next.pop(0)
            if request.method == "PUT" and self.apply_before_failing:
                self._apply(path, request)
            if request.method == "POST" and self.apply_before_failing:
                self._create(request)
            return httpx.Response(code, json={"code": 14, "message": "unavailable", "details": []})
        if request.method == "GET" and path == "/v1/compute/clusters":
            return httpx.Response(200, json={"clusters": list(self.records.values())})
        if request.method == "POST":
            return httpx.Response(200, json=self._create(request))
        cid = path.rsplit("/", 1)[-1]
        if cid not in self.records:
            return httpx.Response(404, json={"code": 5, "message": f"cluster {cid} not found"})
        if request.method == "PUT":
            self._apply(path, request)
        return httpx.Response(200, json=self.records[cid])

    def _create(self, request: httpx.Request) -> dict[str, Any]:
        body = json.loads(request.content)
        cid = f"c-{len(self.records) + 1}"
        rec = dict(next(iter(self.records.values())), cluster_id=cid)
        rec["cluster_name"] = body["cluster_name"]
        rec["desired_preemptible_gpus"] = body.get("num_preemptible_gpus", 0)
        self.records[cid] = rec
        return rec

    def _apply(self, path: str, request: httpx.Request) -> None:
        cid = path.rsplit("/", 1)[-1]
        body = json.loads(request.content)
        self.records[cid]["desired_preemptible_gpus"] = body["num_preemptible_gpus"]


@pytest.fixture
def api(cluster_record: Callable[..., dict[str, Any]]) -> FakeClusters:
    return FakeClusters(
        [
            cluster_record(cluster_id="c-1", cluster_name="train"),
            cluster_record(cluster_id="c-2", cluster_name="dup"),
            cluster_record(cluster_id="c-3", cluster_name="dup"),
        ]
    )


def test_attach_by_id_and_by_name(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, rec = mock_cloud(api)
    assert cloud.attach("c-2").name == "dup"
    assert cloud.attach("train").id == "c-1"
    assert rec.mutating == []
    assert rec.requests[0][:2] == ("GET", "/v1/compute/clusters")


def test_attach_ambiguous_and_unknown(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, rec = mock_cloud(api)
    with pytest.raises(errors.AmbiguousNameError) as amb:
        cloud.attach("dup")
    assert "c-2" in str(amb.value) and "c-3" in str(amb.value) and "attach by id" in str(amb.value)
    with pytest.raises(errors.NotFoundError) as nf:
        cloud.attach("nope")
    assert "dup, train" in str(nf.value)
    assert rec.mutating == []


def test_scale_sends_only_the_target(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, rec = mock_cloud(api)
    cluster = cloud.attach("c-1")
    state = cluster.scale(preemptible=16)
    assert isinstance(state, ClusterState)
    assert state.desired_preemptible_gpus == 16
    assert rec.mutating == [("PUT", "/v1/compute/clusters/c-1", {"num_preemptible_gpus": 16})]
    changed = [e for e in cluster.poll_events() if e.reason == TARGET_CHANGED]
    assert [e.data["to"] for e in changed] == [16]


@pytest.mark.parametrize("bad", [12, -8, "16", True, 16.5])
def test_bad_targets_send_nothing(mock_cloud: Any, api: FakeClusters, bad: object) -> None:
    cloud, rec = mock_cloud(api)
    cluster = cloud.attach("c-1")
    before = len(rec.requests)
    with pytest.raises(errors.ValidationError) as info:
        cluster.scale(preemptible=bad)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert len(rec.requests) == before


def test_positive_target_without_any_project_sends_nothing(
    mock_cloud: Any, api: FakeClusters
) -> None:
    """The project must be configured (TOGETHER_PROJECT_ID), even if the cluster has one."""
    cloud, rec = mock_cloud(api, project_id=None)
    cluster = cloud.attach("c-1")
    before = len(rec.requests)
    with pytest.raises(
        errors.ValidationError, match=r"needs a project \(cluster c-1 is in project proj-1\)"
    ):
        cluster.scale(preemptible=16)
    assert len(rec.requests) == before
    assert cluster.scale(preemptible=0).desired_preemptible_gpus == 0  # 0 needs no project


def test_scale_reads_back_before_resending(mock_cloud: Any, api: FakeClusters) -> None:
    """The PUT went through but its answer was lost (503 after applying): no second PUT."""
    cloud, rec = mock_cloud(api)
    cluster = cloud.attach("c-1")
    api.fail_next = [503]
    api.apply_before_failing = True
    assert cluster.scale(preemptible=8).desired_preemptible_gpus == 8
    assert [r[0] for r in rec.mutating] == ["PUT"]


def test_scale_resends_when_not_applied(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, rec = mock_cloud(api)
    cluster = cloud.attach("c-1")
    api.fail_next = [429]
    assert cluster.scale(preemptible=24).desired_preemptible_gpus == 24
    assert [r[0] for r in rec.mutating] == ["PUT", "PUT"]


def test_wait_reaches_capacity_and_reports_progress(
    mock_cloud: Any, api: FakeClusters, preemptible_node: Callable[..., dict[str, Any]]
) -> None:
    cloud, _ = mock_cloud(api)
    cluster = cloud.attach("c-1")
    cluster.scale(preemptible=16)
    seen: list[int] = []

    def progress(state: ClusterState) -> None:
        seen.append(state.allocated_preemptible_gpus)
        rec = api.records["c-1"]  # the fake fleet adds one node per poll
        n = len(rec["gpu_worker_nodes"])
        rec["gpu_worker_nodes"].append(preemptible_node(n))
        rec["allocated_preemptible_gpus"] = 8 * n

    result = cluster.wait_for_capacity(timeout=30, poll=0.01, callback=progress)
    assert result.reached and bool(result)
    assert seen == [0, 8, 16]
    assert result.polls == 3
    assert len(result.state.preemptible_nodes) == 2


def test_wait_returns_cleanly_when_short(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, _ = mock_cloud(api)
    cluster = cloud.attach("c-1")
    cluster.scale(preemptible=16)
    result = cluster.wait_for_capacity(timeout=0.05, poll=0.01)
    assert not result.reached
    assert result.state.allocated_preemptible_gpus == 0
    assert "still short" in str(result)


def test_events_are_incremental(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, _ = mock_cloud(api)
    cluster = cloud.attach("c-1")
    ev1 = {
        "node_id": "gpu-preemptible-dp-0",
        "reason": "TogetherNodeAdded",
        "message": "added",
        "timestamp": "2026-11-29T10:05:00Z",
    }
    ev2 = {
        "node_id": "gpu-preemptible-dp-0",
        "reason": PREEMPTION_NOTIFIED,
        "message": "reclaim",
        "timestamp": "2026-11-29T10:20:00Z",
    }
    api.records["c-1"]["node_lifecycle_events"] = [ev1, ev1]
    assert [e.reason for e in cluster.poll_events()] == ["TogetherNodeAdded"]
    assert cluster.poll_events() == []
    api.records["c-1"]["node_lifecycle_events"] = [ev2, ev1]
    new = cluster.poll_events()
    assert [(e.reason, e.node) for e in new] == [(PREEMPTION_NOTIFIED, "gpu-preemptible-dp-0")]
    assert len(cluster.events()) == 2
    assert len(cluster.events(since=new[0].time)) == 1


def test_delete_and_transient_reads(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, rec = mock_cloud(api)
    api.fail_next = [503, 429]
    assert cloud.attach("c-1").id == "c-1"  # retried by the policy
    cloud.delete("c-1")
    assert ("DELETE", "/v1/compute/clusters/c-1", None) in rec.requests


def test_create_sends_the_body_once_and_adopts_after_a_lost_answer(
    mock_cloud: Any, api: FakeClusters
) -> None:
    """The POST went through but its answer was lost: tgnb lists, finds it, does not resend."""
    cloud, rec = mock_cloud(api)
    api.fail_next = [503]
    api.fail_method = "POST"
    api.apply_before_failing = True
    cluster = cloud.create("fresh", preemptible=8, cluster_type="SLURM")
    assert cluster.name == "fresh" and cluster.last.desired_preemptible_gpus == 8
    posts = [r for r in rec.mutating if r[0] == "POST"]
    assert len(posts) == 1
    assert posts[0][2]["num_preemptible_gpus"] == 8 and posts[0][2]["project_id"] == "proj-1"
    assert posts[0][2]["cluster_type"] == "SLURM"


def test_create_resends_when_not_created(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, rec = mock_cloud(api)
    api.fail_next = [429]
    api.fail_method = "POST"
    assert cloud.create("fresh").name == "fresh"
    assert [r[0] for r in rec.mutating] == ["POST", "POST"]
    assert sum(r["cluster_name"] == "fresh" for r in api.records.values()) == 1


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_gpus": 12}, "try 8 or 16"),
        ({"preemptible": 12}, "try 8 or 16"),
        ({"cluster_type": "NOMAD"}, "KUBERNETES or SLURM"),
    ],
)
def test_create_checks_before_sending(
    mock_cloud: Any, api: FakeClusters, kwargs: dict[str, Any], fragment: str
) -> None:
    cloud, rec = mock_cloud(api)
    with pytest.raises(errors.ValidationError, match=fragment):
        cloud.create("fresh", **kwargs)
    assert rec.requests == []


def test_events_since_accepts_strings(mock_cloud: Any, api: FakeClusters) -> None:
    cloud, _ = mock_cloud(api)
    api.records["c-1"]["node_lifecycle_events"] = [
        {
            "node_id": "n",
            "reason": "TogetherNodeAdded",
            "message": "",
            "timestamp": "2026-11-29T10:05:00Z",
        }
    ]
    cluster = cloud.attach("c-1")
    assert len(cluster.events(since="2026-11-29T10:05:00Z")) == 1
    assert cluster.events(since="2026-11-29T10:05:01+00:00") == []
    # an age, in the forms Session.events and %tg events --since read (the event is days old)
    assert cluster.events(since="2h") == [] and cluster.events(since=timedelta(hours=2)) == []
    assert len(cluster.events(since="3650d")) == 1
    with pytest.raises(errors.ValidationError, match="is not a time"):
        cluster.events(since="yesterday")
