"""The placer's loop (`tgnb.backends.kubernetes.placer.KubePlacement.tick`) against a fake API server.

No Kubernetes API server can run on these machines (no kube-apiserver, kind, k3s or Docker
engine), so the API server is faked at the HTTP boundary (conftest.py): the real ``kubernetes``
client sends real HTTP to a loopback server that answers the nodes, the pods and the patches with
minimal valid JSON and records every request. What is faked is the cluster's answers (the nodes'
labels, readiness, cordons and GPUs; the gated pods); the decision, the JSON patch and the Event
on the wire are the placer's own. The run's progress is a real ``metrics.jsonl`` in a tmp run
directory, read by `tgnb.runs.recovery.progress` as on the cluster's read-only mount.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.kubernetes.placer import KubePlacement
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.runfile import PlacerConfig

NS = "research"
PODS = f"/api/v1/namespaces/{NS}/pods"
EVENTS = f"/api/v1/namespaces/{NS}/events"
CREATED = "2026-11-29T19:00:00Z"
T0 = 1795978800.0  # CREATED as POSIX seconds
GATE = "tgnb.together.ai/placement"


def node(name: str, cls: str | None, *, ready: bool = True, cordoned: bool = False,
         gpus: int = 8) -> dict[str, Any]:  # fmt: skip
    labels = {"kubernetes.io/hostname": name}
    if cls:
        labels["together.ai/compute-class"] = cls
    spec: dict[str, Any] = {}
    if cordoned:
        spec = {
            "unschedulable": True,
            "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
        }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "96", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def gated_pod(name: str, created: str = CREATED) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": {"tgnb/run": "rec"},
        },
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "img",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def bound_pod(name: str, node_name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "other"},
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "c",
                    "image": "img",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def items(kind: str, *objs: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 200, {"apiVersion": "v1", "kind": kind, "metadata": {}, "items": list(objs)}


def cluster(fake_api: Any, nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
            others: tuple[dict[str, Any], ...] = ()) -> None:  # fmt: skip
    fake_api.route("GET", PODS, items("PodList", *pods))
    fake_api.route("GET", "/api/v1/nodes", items("NodeList", *nodes))
    fake_api.route("GET", "/api/v1/pods", items("PodList", *others))
    for p in pods:
        fake_api.route("PATCH", f"{PODS}/{p['metadata']['name']}", (200, p))


def placer(api_client: Any, policy: RecoveryPolicy, run_dir: Path, nodes: int = 1) -> KubePlacement:
    config = {
        "run": "rec", "namespace": NS, "policy": policy.to_dict(), "nodes": nodes,
        "min_nodes": None, "gpus_per_node": 8, "max_steps": 1000, "launched": T0,
        "run_dir": str(run_dir), "poll_s": 0.01, "deployment": "rec-placer",
    }  # fmt: skip
    return KubePlacement(PlacerConfig.from_dict(config), api_client)


def patches(fake_api: Any) -> dict[str, list[dict[str, Any]]]:
    return {r.path.rsplit("/", 1)[-1]: r for r in fake_api.sent("PATCH")}


def decisions(fake_api: Any) -> list[dict[str, Any]]:
    return [r.body for r in fake_api.sent("POST") if r.path == EVENTS]


NOT_IN = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "together.ai/compute-class",
                            "operator": "NotIn",
                            "values": ["preemptible"],
                        }
                    ]
                }
            ]
        }
    }
}


def test_after_wait_s_the_gated_pods_go_to_a_standard_node(
    fake_api: Any, api_client: Any, tmp_path: Path
) -> None:
    """A cordoned preemptible node, a standard one Ready with 8 GPUs free, two gated pods created
    wait_s ago: each is patched (JSON patch) with the NotIn affinity and without its gate, and one
    RecoveryDecided Event on the first pod carries the decision."""
    cluster(
        fake_api,
        [node("gpu-preemptible-1", "preemptible", cordoned=True), node("gpu-std-1", None),
         node("gpu-std-2", None)],
        [gated_pod("rec-0-aaaaa"), gated_pod("rec-1-bbbbb")],
        (bound_pod("x", "gpu-std-2", 4),),  # half of gpu-std-2 is taken: it does not fit
    )  # fmt: skip
    p = placer(api_client, RecoveryPolicy(when_short="standard", wait_s=600), tmp_path, nodes=2)
    d = p.tick(now=T0 + 601)
    assert d is not None and d.action == "wait"  # 1 standard node free, the run needs 2
    assert fake_api.sent("PATCH") == []
    fake_api.route("GET", "/api/v1/pods", items("PodList"))  # the other run's pod is gone
    d = p.tick(now=T0 + 602)
    assert d is not None and (d.action, d.node_class, d.rule) == ("start", "standard", "standard")
    sent = patches(fake_api)
    assert sorted(sent) == ["rec-0-aaaaa", "rec-1-bbbbb"]
    for req in sent.values():
        assert req.headers["content-type"] == "application/json-patch+json"
        assert req.body == [
            {"op": "remove", "path": "/spec/schedulingGates/0"},
            {"op": "add", "path": "/spec/affinity", "value": NOT_IN},
        ]
    wait_ev, start_ev = decisions(fake_api)
    assert wait_ev["reason"] == start_ev["reason"] == "RecoveryDecided"
    assert wait_ev["message"].startswith("waiting for 2 preemptible nodes")
    assert (
        start_ev["message"]
        == "moved to 2 standard nodes: 0 of 16 preemptible GPUs allocated for 10 min"
    )
    assert start_ev["involvedObject"]["name"] == "rec-0-aaaaa"
    assert start_ev["metadata"]["labels"]["tgnb/run"] == "rec"
    assert json.loads(start_ev["metadata"]["annotations"]["tgnb.together.ai/decision"]) == {
        "action": "start", "node_class": "standard", "nodes": 2, "rule": "standard"
    }  # fmt: skip


def test_a_free_preemptible_node_gets_the_pod_by_node_selector(
    fake_api: Any, api_client: Any, tmp_path: Path
) -> None:
    cluster(fake_api, [node("gpu-preemptible-1", "preemptible"), node("gpu-std-1", None)],
            [gated_pod("rec-0-aaaaa")])  # fmt: skip
    d = placer(api_client, RecoveryPolicy(when_short="standard", wait_s=600), tmp_path).tick(T0 + 5)
    assert d is not None and (d.action, d.node_class) == ("start", "preemptible")
    (req,) = fake_api.sent("PATCH")
    assert req.body == [
        {"op": "remove", "path": "/spec/schedulingGates/0"},
        {"op": "add", "path": "/spec/nodeSelector",
         "value": {"together.ai/compute-class": "preemptible"}},
    ]  # fmt: skip
    assert decisions(fake_api)[0]["message"] == "on 1 preemptible node"


@pytest.mark.parametrize("ready", [False, True])
def test_not_waited_long_enough_leaves_the_pod_gated(
    fake_api: Any, api_client: Any, tmp_path: Path, ready: bool
) -> None:
    """The preemptible node is NotReady (or cordoned): before wait_s, no patch, and one "waiting
    for ..." decision however many ticks (once per change)."""
    pre = node("gpu-preemptible-1", "preemptible", ready=ready, cordoned=ready)
    cluster(fake_api, [pre, node("gpu-std-1", None)], [gated_pod("rec-0-aaaaa")])
    p = placer(api_client, RecoveryPolicy(when_short="standard", wait_s=600), tmp_path)
    for dt in (10, 20, 30):
        d = p.tick(T0 + dt)
        assert d is not None and d.action == "wait"
    assert fake_api.sent("PATCH") == []
    (ev,) = decisions(fake_api)
    assert (
        ev["message"]
        == "waiting for 1 preemptible node: 0 of 8 preemptible GPUs allocated for 10 s"
    )


def test_a_deadline_at_risk_takes_standard_at_once(
    fake_api: Any, api_client: Any, tmp_path: Path
) -> None:
    """The run's metrics.jsonl says step 1 of 1000 an hour after launch, two hours to the deadline:
    behind, so standard nodes now, before any wait (the preemptible node is busy)."""
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "time": T0 + 3600, "loss": 1.0}) + "\n"
    )
    cluster(fake_api, [node("gpu-preemptible-1", "preemptible", gpus=0), node("gpu-std-1", None)],
            [gated_pod("rec-0-aaaaa", "2026-11-29T20:00:00Z")])  # fmt: skip
    policy = RecoveryPolicy(when_short="wait", deadline=T0 + 3 * 3600)
    d = placer(api_client, policy, tmp_path).tick(T0 + 3600 + 1)
    assert d is not None and (d.action, d.node_class, d.rule) == ("start", "standard", "deadline")
    (req,) = fake_api.sent("PATCH")
    assert {"op": "add", "path": "/spec/affinity", "value": NOT_IN} in req.body
    (ev,) = decisions(fake_api)
    assert ev["message"].startswith("moved to standard: slack ran out")


def test_no_gated_pod_no_node_read(fake_api: Any, api_client: Any, tmp_path: Path) -> None:
    """A running run (its pods already placed, on preemptible nodes): the placer reads its Job
    (not finished) and its pods, nothing else, and does nothing."""
    running = gated_pod("rec-0-aaaaa")
    running["spec"].pop("schedulingGates")
    running["spec"]["nodeName"] = "gpu-preemptible-1"
    running["spec"]["nodeSelector"] = {"together.ai/compute-class": "preemptible"}
    running["status"]["phase"] = "Running"
    cluster(fake_api, [], [running])
    assert placer(api_client, RecoveryPolicy(deadline=2e9), tmp_path).tick(T0) is None
    assert [r.path for r in fake_api.requests] == [f"/apis/batch/v1/namespaces/{NS}/jobs/rec", PODS]


def on_standard(name: str, node_name: str) -> dict[str, Any]:
    """A run's pod that a placement on standard nodes put there (the NotIn affinity), running."""
    pod = gated_pod(name)
    pod["spec"].pop("schedulingGates")
    pod["spec"].update(nodeName=node_name, affinity=NOT_IN)
    pod["status"]["phase"] = "Running"
    return pod


def test_a_run_on_standard_nodes_goes_back_to_preemptible_ones(
    fake_api: Any, api_client: Any, tmp_path: Path
) -> None:
    """The run's pod runs on a standard node (moved there after wait_s): while the preemptible
    node is cordoned it stays (nothing deleted, nothing recorded); once the node is back, the
    placer deletes the pod (it checkpoints on SIGTERM; its Job creates it again, gated) and
    records the move back, once."""
    pod = on_standard("rec-0-aaaaa", "gpu-std-1")
    std = node("gpu-std-1", None)
    cluster(fake_api, [node("gpu-preemptible-1", "preemptible", cordoned=True), std], [pod],
            (bound_pod("rec-0-aaaaa", "gpu-std-1", 8),))  # fmt: skip
    fake_api.route("DELETE", f"{PODS}/rec-0-aaaaa", (200, pod))  # the API answers with the pod
    p = placer(api_client, RecoveryPolicy(when_short="standard", wait_s=600), tmp_path)
    d = p.tick(T0 + 700)
    assert d is not None and (d.action, d.node_class) == ("keep", "standard")
    assert fake_api.sent("DELETE") == [] and decisions(fake_api) == []
    cluster(fake_api, [node("gpu-preemptible-1", "preemptible"), std], [pod],
            (bound_pod("rec-0-aaaaa", "gpu-std-1", 8),))  # fmt: skip
    d = p.tick(T0 + 800)
    assert d is not None and (d.action, d.node_class, d.rule) == ("start", "preemptible", "full")
    assert [r.path for r in fake_api.sent("DELETE")] == [f"{PODS}/rec-0-aaaaa"]
    assert fake_api.sent("PATCH") == []
    (ev,) = decisions(fake_api)
    assert ev["message"] == "back to preemptible: on 1 preemptible node"
    assert ev["involvedObject"]["name"] == "rec-0-aaaaa"
    assert json.loads(ev["metadata"]["annotations"]["tgnb.together.ai/decision"]) == {
        "action": "start", "node_class": "preemptible", "nodes": 1, "rule": "full"
    }  # fmt: skip
    # the Job's new pod comes gated: placed on the preemptible node
    cluster(fake_api, [node("gpu-preemptible-1", "preemptible"), std], [gated_pod("rec-0-ccccc")])
    d = p.tick(T0 + 900)
    assert d is not None and (d.action, d.node_class) == ("start", "preemptible")
    assert [r.path for r in fake_api.sent("PATCH")] == [f"{PODS}/rec-0-ccccc"]


def test_the_placer_removes_itself_once_the_job_has_finished(
    fake_api: Any, api_client: Any, tmp_path: Path, k8s: Any
) -> None:
    """The placer is created before the Job: a Job not there yet is not taken for gone; once the
    Job has been seen and has completed, the loop ends and deletes the placer's Deployment."""
    job = f"/apis/batch/v1/namespaces/{NS}/jobs/rec"
    fake_api.route("GET", job, (404, k8s.status(404, "NotFound", "jobs.batch rec not found")))
    cluster(fake_api, [], [])
    p = placer(api_client, RecoveryPolicy(deadline=2e9), tmp_path)
    assert not p.job_finished()
    fake_api.route("GET", job, (200, k8s.job("rec", conditions=[k8s.condition("Complete")])))
    assert p.run() == 0
    deletes = [r.path for r in fake_api.sent("DELETE")]
    assert deletes == [f"/apis/apps/v1/namespaces/{NS}/deployments/rec-placer"]
