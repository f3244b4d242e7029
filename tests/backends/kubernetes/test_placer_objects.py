"""The objects of a run whose recovery policy needs a placer (`tgnb.backends.kubernetes.placer_objects`):
the Job's pods gated with no compute class exactly when a placer is needed, and the placer's
Deployment, ServiceAccount, Role, RoleBinding, ClusterRole, ClusterRoleBinding and ConfigMap, each
validated against the 1.30 schema (kubernetes-validate, strict). Nothing here talks to a cluster."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from tgnb.backends.base import Resources, RunSpec, SecretRef
from tgnb.backends.kubernetes.objects import build_objects
from tgnb.config import register_secret
from tgnb.runs.recovery import RecoveryPolicy

GATE = {"name": "tgnb.together.ai/placement"}


def spec(
    policy: RecoveryPolicy | None, preemptible: bool = True, min_nodes: int | None = None
) -> RunSpec:
    return RunSpec(
        name="rec",
        train={"algorithm": "grpo", "model": "tiny", "max_steps": 1000},
        resources=Resources(nodes=2, min_nodes=min_nodes, gpus_per_node=8, preemptible=preemptible),
        image="ghcr.io/example/tgnb:1",
        recovery=policy,
        secrets={"HF_TOKEN": SecretRef(name="hf", key="token")},
    )


def dicts(
    policy: RecoveryPolicy | None, preemptible: bool = True, min_nodes: int | None = None
) -> list[dict[str, Any]]:
    out = build_objects(spec(policy, preemptible, min_nodes), "research", launched=1.8e9).to_dicts()
    for obj in out:
        kubernetes_validate.validate(obj, "1.30", strict=True)
    return out


def pod_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    job = next(d for d in objs if d["kind"] == "Job")
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize(
    "policy",
    [RecoveryPolicy(when_short="standard", wait_s=600), RecoveryPolicy(deadline=2e9),
     RecoveryPolicy(when_short="wait", deadline=2e9), RecoveryPolicy(when_short="standard", wait_s=0, deadline=2e9)],
    ids=["standard-600s", "deadline", "wait-deadline", "standard-0s-deadline"],
)  # fmt: skip
def test_a_policy_that_needs_a_placer_gates_the_pods_and_leaves_the_class_out(
    policy: RecoveryPolicy,
) -> None:
    """Refused before (check_rendered): now the pods are gated, with no nodeSelector nor affinity
    for the compute class, and the placer's objects come before the Job."""
    objs = dicts(policy)
    pod = pod_of(objs)
    assert pod["schedulingGates"] == [GATE]
    assert "nodeSelector" not in pod and "affinity" not in pod
    kinds = [d["kind"] for d in objs]
    assert kinds == [
        "ConfigMap", "PersistentVolumeClaim", "Service", "ServiceAccount", "Role", "RoleBinding",
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Job",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "policy,selector",
    [
        (RecoveryPolicy(when_short="wait"), True),
        (RecoveryPolicy(when_short="shrink", wait_s=60), True),
        (RecoveryPolicy(when_short="standard", wait_s=0), False),
    ],
)
def test_no_placer_no_gate(policy: RecoveryPolicy, selector: bool) -> None:
    """Without a wait before standard nodes and without a deadline, no gate and no placer: the
    nodeSelector (or the preferred affinity of standard with wait_s=0) as before."""
    objs = dicts(policy, min_nodes=1 if policy.when_short == "shrink" else None)
    pod = pod_of(objs)
    assert "schedulingGates" not in pod
    assert ("nodeSelector" in pod) is selector
    assert not {"Deployment", "ClusterRole", "ServiceAccount"} & {d["kind"] for d in objs}
    standard_run = pod_of(dicts(None, preemptible=False))
    assert "schedulingGates" not in standard_run


def test_the_placer_objects() -> None:
    """The placer runs the run's image on a standard node (NotIn), small, the run's directory
    read-only, its config in its own ConfigMap; its RBAC is the least the loop needs; every
    object has the run's labels; the placer's pod does not carry the run's label (the run's
    status and its Service count the pods that do)."""
    objs = dicts(RecoveryPolicy(deadline=2e9))
    by = {(d["kind"], d["metadata"]["name"]): d for d in objs}
    dep = by[("Deployment", "rec-placer")]
    assert dep["metadata"]["namespace"] == "research"
    tmpl = dep["spec"]["template"]
    assert "tgnb/run" not in tmpl["metadata"]["labels"]
    assert tmpl["metadata"]["labels"]["tgnb/placer-of"] == "rec"
    assert dep["spec"]["selector"]["matchLabels"] == {"tgnb/placer-of": "rec"}
    pod = tmpl["spec"]
    assert pod["serviceAccountName"] == "rec-placer"
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "together.ai/compute-class", "operator": "NotIn", "values": ["preemptible"]}
    ]
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/example/tgnb:1"
    assert c["command"] == [
        "python", "-m", "tgnb.backends.kubernetes.placer", "/config/placer.json"
    ]  # fmt: skip
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    runs = next(m for m in c["volumeMounts"] if m["name"] == "runs")
    assert runs == {
        "name": "runs", "mountPath": "/data/runs/rec", "subPath": "rec", "readOnly": True
    }  # fmt: skip
    config = json.loads(by[("ConfigMap", "rec-placer")]["data"]["placer.json"])
    assert config["launched"] == 1.8e9 and config["max_steps"] == 1000
    assert config["policy"]["deadline"] == 2e9 and config["namespace"] == "research"
    role = by[("Role", "rec-placer")]["rules"]
    assert {"apiGroups": [""], "resources": ["pods"],
            "verbs": ["list", "patch"]} in role  # fmt: skip
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in role
    cluster = by[("ClusterRole", "tgnb-placer:research:rec")]
    assert "namespace" not in cluster["metadata"]
    assert cluster["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    crb = by[("ClusterRoleBinding", "tgnb-placer:research:rec")]
    assert crb["subjects"] == [
        {"kind": "ServiceAccount", "name": "rec-placer", "namespace": "research"}
    ]
    assert crb["roleRef"]["name"] == "tgnb-placer:research:rec"
    for d in objs[3:-1]:
        assert d["metadata"]["labels"]["tgnb/run"] == "rec"
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tgnb"


def test_no_secret_reaches_the_placer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's secrets reach its trainer as secretKeyRef; the placer gets none of them, not
    even as a reference, and no registered value is in any object."""
    value = "hf_placer-check-token-value-42"
    monkeypatch.setenv("HF_TOKEN", value)
    register_secret(value)
    objs = dicts(RecoveryPolicy(when_short="standard", wait_s=300))
    assert all(value not in json.dumps(d) for d in objs)
    placer = [
        d
        for d in objs
        if d["metadata"]["name"].endswith("placer") or "tgnb-placer" in d["metadata"]["name"]
    ]
    assert len(placer) == 7
    assert all(
        "secretKeyRef" not in json.dumps(d) and "HF_TOKEN" not in json.dumps(d) for d in placer
    )
