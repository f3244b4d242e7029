"""The official together SDK (3.x) against the emulator over real HTTP on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import together

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle

from .conftest import create


def _allocated(sdk: together.Together, cluster_id: str) -> int:
    return int(sdk.clusters.retrieve(cluster_id).allocated_preemptible_gpus)


def test_create_update_retrieve_with_a_preemptible_target(
    emulator: EmulatorHandle, sdk: together.Together
) -> None:
    cluster = create(sdk, num_preemptible_gpus=8, project_id="proj-a")
    assert cluster.desired_preemptible_gpus == 8
    assert cluster.allocated_preemptible_gpus == 0  # preemptible nodes fill in asynchronously
    assert cluster.status == "Ready"
    assert cluster.project_id == "proj-a"
    assert [n.node_id for n in cluster.gpu_worker_nodes if n.status == "Ready"] == [
        f"gpu-dp-{cluster.cluster_id.replace('-', '')[:8]}-0"
    ]

    updated = sdk.clusters.update(cluster.cluster_id, num_preemptible_gpus=16)
    assert updated.desired_preemptible_gpus == 16
    assert updated.num_gpus == 8  # omitted fields keep their value

    got = sdk.clusters.retrieve(cluster.cluster_id)
    assert got.desired_preemptible_gpus == 16
    assert got.cluster_name == "my-cluster"
    # every required field parsed into the SDK's own model (pydantic would have raised otherwise)
    required = {name for name, f in type(got).model_fields.items() if f.is_required()}
    assert required <= set(got.model_dump(exclude_unset=True))
    assert emulator.requests()[-1]["path"] == f"/v1/compute/clusters/{cluster.cluster_id}"


def test_allocated_rises_toward_desired(sdk: together.Together, emulator: EmulatorHandle) -> None:
    cluster = create(sdk, num_preemptible_gpus=24, project_id="p")
    seen: list[int] = []

    def full() -> bool:
        seen.append(_allocated(sdk, cluster.cluster_id))
        return seen[-1] == 24

    wait_until(full, timeout=60)
    assert seen == sorted(seen)  # never goes down while nothing is preempted
    assert seen[0] < 24
    nodes = sdk.clusters.retrieve(cluster.cluster_id).gpu_worker_nodes
    preemptible = [n for n in nodes if n.node_id.startswith("gpu-preemptible-dp-")]
    assert len(preemptible) == 3 and all(n.num_gpus == 8 for n in preemptible)
    assert all(n.phase_transitions[-1].phase == "NODE_PHASE_RUNNING" for n in preemptible)


def test_preemption_notice_then_removal_then_replacement(
    sdk: together.Together, emulator: EmulatorHandle
) -> None:
    cluster = create(sdk, num_preemptible_gpus=8, project_id="p")
    cid = cluster.cluster_id
    wait_until(lambda: _allocated(sdk, cid) == 8)
    victim = emulator.preempt(cid)
    assert victim["state"] == "draining" and victim["deadline"]

    # draining: still allocated (live until removed), shown as marked for deletion
    now = sdk.clusters.retrieve(cid)
    node = next(n for n in now.gpu_worker_nodes if n.node_id == victim["name"])
    assert node.marked_for_deletion is True
    assert now.allocated_preemptible_gpus == 8

    def replaced() -> bool:
        names = {n.node_id for n in sdk.clusters.retrieve(cid).gpu_worker_nodes}
        return victim["name"] not in names and _allocated(sdk, cid) == 8

    wait_until(replaced, timeout=60)
    got = sdk.clusters.retrieve(cid)
    events = sorted(got.node_lifecycle_events or [], key=lambda e: e.timestamp)
    story = [(e.reason, e.node_id) for e in events if e.node_id.startswith("gpu-preemptible")]
    replacement = next(
        n.node_id for n in got.gpu_worker_nodes if n.node_id.startswith("gpu-preemptible")
    )
    assert story == [
        ("TogetherNodeAdded", victim["name"]),
        ("TogetherPreemptionNotified", victim["name"]),
        ("TogetherPreempted", victim["name"]),
        ("TogetherNodeAdded", replacement),
    ]
    deleted = {n.node_id: n for n in got.deleted_gpu_worker_nodes or []}
    assert deleted[victim["name"]].deleted_at is not None


def test_notice_and_removed_files_for_the_workload_plane(
    sdk: together.Together, emulator: EmulatorHandle
) -> None:
    cid = create(sdk, num_preemptible_gpus=8, project_id="p").cluster_id
    wait_until(lambda: _allocated(sdk, cid) == 8)
    victim = emulator.preempt(cid)
    node_dir = Path(victim["dir"])
    assert node_dir.parent.parent == emulator.state_dir
    notice = json.loads((node_dir / "preemption-notice.json").read_text())
    assert notice["node"] == victim["name"] and notice["cluster_id"] == cid
    assert notice["reason"] == "TogetherPreemptionNotified"
    assert notice["deadline"] == victim["deadline"] and notice["deadline_unix"] > 0
    assert not (node_dir / "removed.json").exists()
    removed_file = node_dir / "removed.json"
    # no request in between: the emulator's clock removes the node on its own
    wait_until(removed_file.exists, timeout=60)
    removed = json.loads(removed_file.read_text())
    assert removed["reason"] == "TogetherPreempted" and removed["node"] == victim["name"]
    states = {n["name"]: n["state"] for n in emulator.nodes(cid)}
    assert states[victim["name"]] == "removed"


def test_capacity_cap_keeps_allocated_below_desired(
    sdk: together.Together, emulator: EmulatorHandle
) -> None:
    emulator.set_capacity(16)
    cid = create(sdk, num_preemptible_gpus=32, project_id="p").cluster_id
    wait_until(lambda: _allocated(sdk, cid) == 16, timeout=60)
    # no node is even provisioning beyond the cap
    kinds = [n for n in emulator.nodes(cid) if n["kind"] == "preemptible"]
    assert [n["state"] for n in kinds] == ["running", "running"]
    got = sdk.clusters.retrieve(cid)
    assert (got.desired_preemptible_gpus, got.allocated_preemptible_gpus) == (32, 16)
    emulator.set_capacity(None)  # capacity frees up: the target is reached
    wait_until(lambda: _allocated(sdk, cid) == 32, timeout=60)


def test_lowering_the_target_scales_down(sdk: together.Together, emulator: EmulatorHandle) -> None:
    cid = create(sdk, num_preemptible_gpus=16, project_id="p").cluster_id
    wait_until(lambda: _allocated(sdk, cid) == 16, timeout=60)
    after = sdk.clusters.update(cid, num_preemptible_gpus=8)
    assert after.allocated_preemptible_gpus == 8
    reasons = [e.reason for e in after.node_lifecycle_events or []]
    assert reasons.count("TogetherScaledDown") == 1
    after = sdk.clusters.update(cid, num_preemptible_gpus=0)
    assert after.allocated_preemptible_gpus == 0
    assert not [n for n in after.gpu_worker_nodes if "preemptible" in n.node_id]


def test_list_filters_by_project_and_delete(sdk: together.Together) -> None:
    a = create(sdk, cluster_name="a", project_id="proj-a")
    b = create(sdk, cluster_name="b", project_id="proj-b")
    assert {c.cluster_id for c in sdk.clusters.list().clusters} == {a.cluster_id, b.cluster_id}
    only_a = sdk.clusters.list(project_id="proj-a").clusters
    assert [c.cluster_name for c in only_a] == ["a"]
    assert sdk.clusters.delete(a.cluster_id).cluster_id == a.cluster_id
    assert [c.cluster_id for c in sdk.clusters.list().clusters] == [b.cluster_id]


def test_regions_whoami_projects(sdk: together.Together, emulator: EmulatorHandle) -> None:
    regions = sdk.clusters.list_regions().regions
    central = next(r for r in regions if r.name == "us-central-2")
    assert "RTX_6000_PCI" in central.supported_instance_types
    assert any(v.nvidia_driver_version == "570" for v in central.driver_versions)
    me = sdk.whoami()
    assert me.type == "project_api_key"
    assert me.project.id == emulator.project_id  # type: ignore[union-attr]
    assert emulator.project_id in [p.id for p in sdk.projects.list()]


def test_kube_config_is_a_kubeconfig_for_kubernetes_only(sdk: together.Together) -> None:
    import base64

    k8s = create(sdk)
    text = base64.b64decode(k8s.kube_config).decode()
    assert "server: https://127.0.0.1:6443" in text and "kind: Config" in text
    slurm = create(sdk, cluster_type="SLURM", cluster_name="s")
    assert slurm.kube_config == ""


def test_a_base_url_ending_in_v1_also_works(emulator: EmulatorHandle) -> None:
    client = together.Together(
        base_url=emulator.base_url + "/v1", api_key=emulator.api_key, max_retries=0
    )
    assert client.clusters.list().clusters == []
    assert client.whoami().type == "project_api_key"
    assert [e["path"] for e in emulator.requests()] == ["/v1/compute/clusters", "/v3/whoami"]
