"""A run's state from its Job and pods (client models), with no API calls.

Restart count: the number of times a pod of the run was recreated, summed over indexes. For each
index it is the larger of the pods still listed minus one and the failure counters the Job
controller keeps on the newest pod (counted + ignored failures; pods of removed nodes disappear,
the counters do not).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tgnb.backends.base import JobState, JobStatus
from tgnb.backends.kubernetes import labels as L

_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def index_of(pod: Any) -> int:
    meta = pod.metadata
    for source in (meta.annotations or {}, meta.labels or {}):
        value = source.get(_INDEX_KEY)
        if value is not None and str(value).isdigit():
            return int(value)
    return 0


def pod_order(pod: Any) -> tuple[int, datetime, str]:
    created = pod.metadata.creation_timestamp or _EPOCH
    return index_of(pod), created, pod.metadata.name or ""


def _counter(pod: Any, key: str) -> int:
    value = (pod.metadata.annotations or {}).get(key)
    return int(value) if value is not None and str(value).isdigit() else 0


def _phase(pod: Any) -> str:
    return (pod.status.phase if pod.status else None) or "Pending"


def _condition(job: Any, *types: str) -> Any:
    for cond in (job.status.conditions or []) if job.status else []:
        if cond.type in types and cond.status == "True":
            return cond
    return None


def _exit_code(pod: Any) -> int | None:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.name == L.CONTAINER and cs.state is not None and cs.state.terminated is not None:
            return int(cs.state.terminated.exit_code)
    return None


def _waiting_detail(pod: Any) -> str:
    """Why a pod is not running yet: unschedulable, image pull back-off, ..."""
    status = pod.status
    if status is None:
        return ""
    for cs in status.init_container_statuses or []:
        if cs.name == L.BACKOFF_CONTAINER and cs.state is not None and cs.state.running:
            failures = _counter(pod, L.INDEX_FAILURES_ANNOTATION)
            return f"failure {failures} counted: waiting the recovery policy's backoff"
    for cs in status.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason not in (None, "ContainerCreating"):
            return f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".rstrip(": ")
    return ""


def restarts_by_index(job: Any, pods: list[Any]) -> dict[int, int]:
    by_index: dict[int, list[Any]] = {}
    for pod in sorted(pods, key=pod_order):
        by_index.setdefault(index_of(pod), []).append(pod)
    out = {}
    for index, group in by_index.items():
        newest = group[-1]
        counters = _counter(newest, L.INDEX_FAILURES_ANNOTATION) + _counter(
            newest, L.INDEX_IGNORED_FAILURES_ANNOTATION
        )
        out[index] = max(len(group) - 1, counters)
    return out


def summarize(job: Any, pods: list[Any]) -> JobStatus:
    """The `JobStatus` of a run from its Job and all its pods."""
    pods = sorted(pods, key=pod_order)
    restarts = sum(restarts_by_index(job, pods).values())
    live = [p for p in pods if _phase(p) in ("Pending", "Running")]
    nodes = tuple(sorted({p.spec.node_name for p in live if p.spec and p.spec.node_name}))
    finished_pods = [p for p in pods if _phase(p) in ("Succeeded", "Failed")]
    last_exit = _exit_code(finished_pods[-1]) if finished_pods else None

    if job.metadata is not None and job.metadata.deletion_timestamp is not None:
        return JobStatus(JobState.CANCELLED, restarts, nodes, last_exit, "being deleted")
    done = _condition(job, "Complete", "SuccessCriteriaMet")
    if done is not None:
        return JobStatus(JobState.SUCCEEDED, restarts, nodes, 0, done.reason or "")
    failed = _condition(job, "Failed", "FailureTarget")
    if failed is not None:
        failed_pods = [p for p in pods if _phase(p) == "Failed"]
        code = _exit_code(failed_pods[-1]) if failed_pods else None
        detail = f"{failed.reason or 'Failed'}: {failed.message or ''}".rstrip(": ")
        return JobStatus(JobState.FAILED, restarts, nodes, code, detail)
    if _condition(job, "Suspended") is not None:
        return JobStatus(JobState.PENDING, restarts, nodes, None, "suspended")

    completions = (job.spec.completions if job.spec else None) or 1
    newest: dict[int, Any] = {}
    for pod in pods:
        newest[index_of(pod)] = pod
    running = [i for i, p in newest.items() if _phase(p) == "Running"]
    waiting = [p for p in newest.values() if _phase(p) == "Pending"]
    detail = next((d for d in map(_waiting_detail, waiting) if d), "")
    terminating = [p for p in live if p.metadata.deletion_timestamp is not None]
    if terminating and not detail:
        detail = "terminating on " + ", ".join(
            sorted({p.spec.node_name or "?" for p in terminating})
        )
    if len(running) == completions:
        return JobStatus(JobState.RUNNING, restarts, nodes, None, detail)
    if restarts > 0:
        return JobStatus(JobState.REQUEUED, restarts, nodes, last_exit, detail or "replacing a pod")
    return JobStatus(JobState.PENDING, restarts, nodes, None, detail)
