"""The recovery policy rendered into the Indexed Job (`tgnb.backends.kubernetes.objects`): the
failure budget (backoffLimitPerIndex and torchrun's --max_restarts), the "resume me" codes the pod
failure policy ignores, the final codes that fail the Job, and the node range; each Job validated
against the 1.30 schema (kubernetes-validate, strict)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.kubernetes.objects import build_objects
from tgnb.runs.recovery import RecoveryPolicy


def job_of(policy: RecoveryPolicy | None, min_nodes: int | None = 1) -> dict[str, Any]:
    spec = RunSpec(
        name="rec",
        train={"algorithm": "grpo", "model": "tiny"},
        resources=Resources(nodes=2, min_nodes=min_nodes, gpus_per_node=8),
        image="ghcr.io/example/tgnb:1",
        recovery=policy,
    )
    job = next(d for d in build_objects(spec, "default").to_dicts() if d["kind"] == "Job")
    kubernetes_validate.validate(job, "1.30", strict=True)
    return job


def args(job: dict[str, Any]) -> list[str]:
    c = job["spec"]["template"]["spec"]["containers"][0]
    return [*c.get("command", []), *c.get("args", [])]


def test_the_budgets_come_from_the_policy() -> None:
    job = job_of(RecoveryPolicy(max_restarts=7, resume_codes=(75, 76), when_short="shrink"))
    assert job["spec"]["backoffLimitPerIndex"] == 7
    assert "--max_restarts=7" in args(job) and "--nnodes=1:2" in args(job)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    by_action = {
        r["action"]: r.get("onExitCodes", {}).get("values") for r in rules if "onExitCodes" in r
    }
    assert by_action == {"Ignore": [75, 76], "FailJob": [2, 74, 77, 78]}


def test_wait_keeps_all_nodes_and_the_default_is_three() -> None:
    job = job_of(RecoveryPolicy(when_short="wait"))
    assert "--nnodes=2" in args(job)
    assert job_of(None, min_nodes=None)["spec"]["backoffLimitPerIndex"] == 3


def test_standard_prefers_preemptible_nodes_and_falls_back_to_standard_ones() -> None:
    """`when_short="standard", wait_s=0`: no nodeSelector, a preferred affinity of weight 100 for
    preemptible nodes (no required term, so a standard node takes the pod when no preemptible one
    fits, and each recreated pod asks again), the schema-valid Job otherwise unchanged."""
    job = job_of(RecoveryPolicy(when_short="standard", wait_s=0))
    pod = job["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod
    affinity = pod["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 100,
            "preference": {
                "matchExpressions": [
                    {
                        "key": "together.ai/compute-class",
                        "operator": "In",
                        "values": ["preemptible"],
                    }
                ]
            },
        }
    ]
    wait = job_of(RecoveryPolicy(when_short="wait"))["spec"]["template"]["spec"]
    assert wait["nodeSelector"] == {"together.ai/compute-class": "preemptible"}


def test_the_pod_after_a_counted_failure_waits_the_policys_backoff() -> None:
    """An init container, before the workdir's, sleeps the policy's delay (its table, from
    `tgnb.runs.placing`) for the index's failure count the Job controller annotates, once per
    count (a file per index in the run directory); none when the policy never waits."""
    job = job_of(RecoveryPolicy(max_restarts=5, backoff_s=1.5, backoff_max_s=7))
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert init["command"] == [
        "python", "-m", "tgnb.runs.placing", "backoff", "$(TGNB_INDEX_FAILURE_COUNT)",
        "1.5,3,6,7", "/data/runs/rec/.tgnb-backoff-$(JOB_COMPLETION_INDEX)",
    ]  # fmt: skip
    failures = next(e for e in init["env"] if e["name"] == "TGNB_INDEX_FAILURE_COUNT")
    assert failures["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"
    )
    assert init["volumeMounts"] == [
        {"name": "runs", "mountPath": "/data/runs/rec", "subPath": "rec"}
    ]
    for never in (RecoveryPolicy(max_restarts=0), RecoveryPolicy(backoff_s=0)):
        assert "initContainers" not in job_of(never)["spec"]["template"]["spec"]
