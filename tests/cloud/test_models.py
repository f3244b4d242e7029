"""`ClusterState` from API records: the standard/preemptible split, phases, events, reprs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tgnb.cloud import ClusterState
from tgnb.events import NODE_ADDED


def test_split_phases_and_reprs(
    cluster_record: Callable[..., dict[str, Any]], preemptible_node: Callable[..., dict[str, Any]]
) -> None:
    rec = cluster_record(
        cluster_name="<b>train</b>",
        desired_preemptible_gpus=16,
        allocated_preemptible_gpus=8,
        node_lifecycle_events=[
            {
                "node_id": "gpu-preemptible-dp-1",
                "reason": NODE_ADDED,
                "message": "m",
                "timestamp": "2026-11-29T10:05:00Z",
            },
            {
                "node_id": "gpu-preemptible-dp-1",
                "reason": NODE_ADDED,
                "message": "m",
                "timestamp": "2026-11-29T10:05:00Z",
            },
            {"node_id": "x"},  # malformed: skipped
        ],
    )
    rec["gpu_worker_nodes"].append(preemptible_node(1))
    state = ClusterState.from_api(rec)
    assert [n.name for n in state.standard_nodes] == ["gpu-dp-0"]
    assert [n.name for n in state.preemptible_nodes] == ["gpu-preemptible-dp-1"]
    assert state.standard_nodes[0].phase == "RUNNING"
    assert state.phase == "READY"
    assert not state.capacity_reached
    assert len(state.events) == 1 and state.events[0].node == "gpu-preemptible-dp-1"
    text = repr(state)
    assert "target 16, allocated 8" in text
    assert "gpu-preemptible-dp-1  preemptible  8" in text
    html = state._repr_html_()
    assert "&lt;b&gt;train&lt;/b&gt;" in html and "<table>" in html
    kube = rec["kube_config"]
    assert kube not in text and kube not in html and kube not in str(state.__dict__)


def test_from_sdk_model(cluster_record: Callable[..., dict[str, Any]]) -> None:
    from together.types import Cluster

    model = Cluster.model_validate(cluster_record(cluster_type="SLURM"))
    state = ClusterState.from_api(model)
    assert state.type == "SLURM" and state.num_gpus == 8 and state.region == "us-central-2"
    assert state == ClusterState.from_api(cluster_record(cluster_type="SLURM"))


def test_no_nodes() -> None:
    state = ClusterState.from_api({"cluster_id": "c", "cluster_name": "n"})
    assert "(no GPU worker nodes)" in str(state)
    assert state.capacity_reached
