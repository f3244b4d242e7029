"""The Kubernetes workload backend: runs as Indexed Jobs, followed through pods, logs and events.

`KubernetesBackend` speaks to one namespace through an `ApiClient` it is given (see
`tgnb.backends.kubernetes.kubeconfig` to build one from a cluster's ``kube_config``). A job id is the
run's name, which is also the Job's name.

What it can see: the Job and its pods (state, nodes, restart count), the pods' logs, the
``TogetherPreemptionNotified`` events of the nodes the run's pods were placed on, the
``RecoveryDecided`` Events of the run's placer (`tgnb.backends.kubernetes.placer`), and the run's own
records that the training process prints on stdout (``@tgnb `` lines). The run's ``events.jsonl``
lies on the shared volume claim inside the cluster and is not reachable from here.

The placer's API calls (create, delete, read its decisions) are in
`tgnb.backends.kubernetes.placer_api`; the one-line errors for a failed API call in
`tgnb.backends.kubernetes.apierrors`.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tgnb.backends.base import JobState, JobStatus, RunSpec
from tgnb.backends.kubernetes import groups, podlogs
from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.apierrors import api_error, event_time
from tgnb.backends.kubernetes.objects import RunObjects, build_objects, config_map_name
from tgnb.backends.kubernetes.placer_api import PlacerApi
from tgnb.backends.kubernetes.podlogs import PodMark
from tgnb.backends.kubernetes.status import index_of, pod_order, summarize
from tgnb.errors import BackendError, NotFoundError, TgnbError
from tgnb.events import PREEMPTION_NOTIFIED, Event, dedupe, from_record, parse_record
from tgnb.runs import budget, ftcheck
from tgnb.runs.cursor import LogChunk
from tgnb.runs.node import Exit


class KubernetesBackend:
    """Submit, follow and cancel runs in one namespace of a Kubernetes cluster."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: Any,
        namespace: str = "default",
        *,
        claim: str = L.DEFAULT_CLAIM,
        claim_size: str = L.DEFAULT_CLAIM_SIZE,
        storage_class: str | None = None,
        poll_interval: float = 2.0,
    ) -> None:
        L.check_name("namespace", namespace)
        self.api_client = api_client
        self.namespace = namespace
        self.claim = claim
        self.claim_size = claim_size
        self.storage_class = storage_class
        self.poll_interval = poll_interval
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self._placer = PlacerApi(self.core, self.rbac, self.apps, namespace)
        self._nodes_seen: dict[str, set[str]] = {}
        self._cancelled: set[str] = set()

    @classmethod
    def from_kube_config(
        cls,
        kube_config: str | bytes | None,
        namespace: str | None = None,
        *,
        context: str | None = None,
        cluster: str = "",
        **options: Any,
    ) -> KubernetesBackend:
        """Build from a cluster's base64 ``kube_config`` field (namespace: the context's)."""
        from tgnb.backends.kubernetes.kubeconfig import (
            api_client_from_kube_config,
            context_namespace,
        )

        api = api_client_from_kube_config(kube_config, context=context, cluster=cluster)
        ns = namespace or context_namespace(kube_config, context)
        return cls(api, ns, **options)

    def __repr__(self) -> str:
        host = getattr(getattr(self.api_client, "configuration", None), "host", "?")
        return f"KubernetesBackend(host={host!r}, namespace={self.namespace!r})"

    # -- submit -------------------------------------------------------------------------------

    def build(self, spec: RunSpec) -> RunObjects:
        """The objects `submit` would create (validated; nothing sent)."""
        ftcheck.refuse_moves(spec, "Kubernetes")  # replica groups: no placer per group here
        return build_objects(
            spec,
            self.namespace,
            claim=self.claim,
            claim_size=self.claim_size,
            storage_class=self.storage_class,
        )

    def preflight(self, spec: RunSpec) -> RunObjects:
        """Everything `submit` checks before it sends anything (the objects build and validate);
        the objects, which `submit` sends."""
        return self.build(spec)

    def run_dir_for(self, name: str) -> None:
        """None: a run's directory is on the pods' volume, not a path this machine chooses."""
        return None

    def recover(self, job_id: str) -> bool:
        """False: the Job controller recreates the pods of a run itself."""
        return False

    def submit(self, spec: RunSpec, prepared: RunObjects | None = None) -> str:
        """Create the run's ConfigMap, the shared claim (if absent), its Service, its placer (when
        its policy needs one: `placer_objects`) and its Job. The placer goes before the Job: the
        Job's pods are gated until a placer lifts the gate, so a placer refused (a user who may not
        create its ClusterRole) must leave no Job whose pods would wait forever."""
        objs = prepared or self.build(spec)  # built once per launch: `preflight`'s
        ns, name = self.namespace, spec.name
        exists = BackendError(
            f"a run named {name!r} already exists in namespace {ns!r}: "
            "pick another name or cancel the old run first"
        )
        created: list[tuple[str, str]] = []
        try:
            try:
                self.core.create_namespaced_config_map(ns, objs.config_map)
            except ApiException as exc:
                raise (
                    exists if exc.status == 409 else api_error(exc, "create the run's config")
                ) from None
            created.append(("configmap", config_map_name(name)))
            try:
                self.core.create_namespaced_persistent_volume_claim(ns, objs.claim)
            except ApiException as exc:
                if exc.status != 409:  # the shared claim exists already: keep it
                    raise api_error(exc, f"create the volume claim {self.claim!r}") from None
            if objs.service is not None:
                try:
                    self.core.create_namespaced_service(ns, objs.service)
                except ApiException as exc:
                    raise (
                        exists
                        if exc.status == 409
                        else api_error(exc, "create the run's headless Service")
                    ) from None
                created.append(("service", name))
            if objs.placer is not None:
                self._placer.create(objs, created)
            if objs.lighthouse is not None:  # replica groups (tgnb.backends.kubernetes.groups)
                house = groups.lighthouse_name(name)
                steps: list[tuple[str, Any, Any]] = [
                    ("service", self.core.create_namespaced_service, objs.lighthouse.service),
                    (
                        "deployment",
                        self.apps.create_namespaced_deployment,
                        objs.lighthouse.deployment,
                    ),
                ]
                for kind, create, obj in steps:
                    try:
                        create(ns, obj)
                    except ApiException as exc:
                        raise (
                            exists
                            if exc.status == 409
                            else api_error(exc, f"create the run's lighthouse {kind}")
                        ) from None
                    created.append((kind, house))
            try:
                job = self.batch.create_namespaced_job(ns, objs.job)
            except ApiException as exc:
                raise (exists if exc.status == 409 else api_error(exc, "create the Job")) from None
            if objs.lighthouse is not None:
                self._own_lighthouse(name, job)
        except TgnbError:
            self._placer.delete_quietly(created)
            raise
        except Exception as exc:
            self._placer.delete_quietly(created)
            raise api_error(exc, "submit the run") from None
        self._nodes_seen[name] = set()
        self._cancelled.discard(name)
        return name

    def _own_lighthouse(self, name: str, job: Any) -> None:
        """Make the run's Job the owner of its lighthouse's Service and Deployment, so that
        Kubernetes' garbage collector deletes them with the Job (`cancel`); if that is refused,
        the Job is deleted too (the caller deletes the rest) and the error raised."""
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid}
        patch = {"metadata": {"ownerReferences": [owner]}}
        house = groups.lighthouse_name(name)
        try:
            self.core.patch_namespaced_service(house, self.namespace, patch)
            self.apps.patch_namespaced_deployment(house, self.namespace, patch)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.batch.delete_namespaced_job(
                    name, self.namespace, propagation_policy="Foreground"
                )
            raise api_error(exc, "make the Job the owner of its lighthouse") from None

    # -- follow -------------------------------------------------------------------------------

    def _job(self, job_id: str) -> Any:
        try:
            return self.batch.read_namespaced_job(job_id, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFoundError(
                    f"no run {job_id!r} in namespace {self.namespace!r}: list runs to find its name",
                    404,
                ) from None
            raise api_error(exc, f"read the Job {job_id!r}") from None
        except Exception as exc:
            raise api_error(exc, f"read the Job {job_id!r}") from None

    def _pods(self, job_id: str) -> list[Any]:
        try:
            found = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{L.RUN_LABEL}={job_id}"
            )
        except Exception as exc:
            raise api_error(exc, f"list the pods of {job_id!r}") from None
        pods = sorted(found.items or [], key=pod_order)
        seen = self._nodes_seen.setdefault(job_id, set())
        seen.update(p.spec.node_name for p in pods if p.spec and p.spec.node_name)
        return pods

    def status(self, job_id: str) -> JobStatus:
        try:
            job = self._job(job_id)
        except NotFoundError:
            if job_id in self._cancelled:
                return JobStatus(JobState.CANCELLED, detail="deleted")
            raise
        pods = self._pods(job_id)
        found = summarize(job, pods)
        if found.exit_code == int(Exit.STOPPED):  # its budget, or the program's own exit 77
            own = [e for pod in pods for e in run_records(_split(self._read_log(pod)), job_id)]
            return budget.settle(found, own)
        return found

    def restart_count(self, job_id: str) -> int:
        return self.status(job_id).restart_count

    def cancel(self, job_id: str) -> None:
        """Delete the Job (foreground: its pods go first, with their grace period), its Service,
        its ConfigMap and its placer's objects (a lighthouse goes with the Job: it owns it). The shared claim, and so the run's checkpoints,
        stay."""
        try:
            self.batch.delete_namespaced_job(
                job_id, self.namespace, propagation_policy="Foreground"
            )
        except ApiException as exc:
            if exc.status == 404:
                raise NotFoundError(
                    f"no run {job_id!r} in namespace {self.namespace!r}: nothing to cancel", 404
                ) from None
            raise api_error(exc, f"delete the Job {job_id!r}") from None
        except Exception as exc:
            raise api_error(exc, f"delete the Job {job_id!r}") from None
        self._cancelled.add(job_id)
        for delete, obj in (
            (self.core.delete_namespaced_service, job_id),
            (self.core.delete_namespaced_config_map, config_map_name(job_id)),
        ):
            try:
                delete(obj, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise api_error(exc, f"delete {obj!r}") from None
        self._placer.delete_placer(job_id)

    def logs(self, job_id: str, follow: bool = False, index: int = 0) -> Iterator[str]:
        """Lines (without newline) of the trainer container in the pods of `index`, oldest pod
        first. With `follow`, streams the live pod and moves on to its replacement after a
        preemption, until the run has finished."""
        if not follow:
            for pod in self._index_pods(job_id, index):
                yield from _split(self._read_log(pod))
            return
        streamed: set[str] = set()
        while True:
            finished: bool | None = None
            for pod in self._index_pods(job_id, index):
                name = pod.metadata.name
                if name in streamed:
                    continue
                if not _started(pod):
                    if finished is None:
                        finished = self._finished(job_id)
                    if not finished:
                        break  # wait for it to start
                    continue
                streamed.add(name)
                yield from self._stream_log(name)
            else:
                if self._finished(job_id):
                    return
            time.sleep(self.poll_interval)

    def logs_after(
        self, job_id: str, after: dict[str, PodMark] | None = None, index: int = 0
    ) -> LogChunk:
        """The trainer lines of the pods of `index` (oldest first) logged since the cursor
        `after` (None: all), and the cursor past them: a pod whose container ended is read once,
        the live one from its last line read (`tgnb.backends.kubernetes.podlogs`)."""
        pods = [p for p in self._index_pods(job_id, index) if _started(p)]
        return podlogs.logs_after(self.core, self.namespace, pods, after)

    def _finished(self, job_id: str) -> bool:
        try:
            return self.status(job_id).state.finished
        except NotFoundError:  # deleted meanwhile: nothing more will be logged
            return True

    def _index_pods(self, job_id: str, index: int) -> list[Any]:
        return [p for p in self._pods(job_id) if index_of(p) == index]

    def _read_log(self, pod: Any) -> str:
        if not _started(pod):
            return ""
        try:
            text: str = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, container=L.CONTAINER
            )
            return text or ""
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or its node is gone
                return ""
            raise api_error(exc, f"read the logs of {pod.metadata.name!r}") from None

    def _stream_log(self, pod_name: str) -> Iterator[str]:
        try:
            resp: Any = self.core.read_namespaced_pod_log(
                pod_name,
                self.namespace,
                container=L.CONTAINER,
                follow=True,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (400, 404):
                return
            raise api_error(exc, f"follow the logs of {pod_name!r}") from None
        buf = b""
        try:
            for chunk in resp.stream(4096):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace").rstrip("\r")
            if buf:
                yield buf.decode("utf-8", "replace").rstrip("\r")
        finally:
            resp.release_conn()

    def events(self, job_id: str) -> list[Event]:
        """``TogetherPreemptionNotified`` events of the nodes the run's pods were placed on, its
        placer's decisions (``RecoveryDecided``), and the run's own records found in its pods' logs (the ``events.jsonl`` on the claim is not
        reachable from here; pods whose node was removed take their logs with them)."""
        pods = self._pods(job_id)
        nodes = self._nodes_seen.get(job_id, set()) | self._scheduled_nodes(job_id)
        out: list[Event] = []
        try:
            found = self.core.list_event_for_all_namespaces(
                field_selector=f"reason={PREEMPTION_NOTIFIED}"
            )
        except Exception as exc:
            raise api_error(exc, "list TogetherPreemptionNotified events") from None
        for item in found.items or []:
            obj = item.involved_object
            if obj is None or obj.kind != "Node" or obj.name not in nodes:
                continue
            out.append(
                Event(
                    time=event_time(item),
                    source="cluster",
                    reason=PREEMPTION_NOTIFIED,
                    message=item.message or "",
                    node=obj.name,
                    run=job_id,
                )
            )
        out.extend(self._placer.decisions(job_id))
        for pod in pods:
            out.extend(run_records(_split(self._read_log(pod)), job_id))
        return dedupe(out)

    def _scheduled_nodes(self, job_id: str) -> set[str]:
        """Nodes the run's pods were assigned to, from the namespace's ``Scheduled`` events: a
        pod whose node was removed is deleted with it, its scheduling event outlives it (for the
        cluster's event retention, an hour by default)."""
        try:
            found = self.core.list_namespaced_event(
                self.namespace, field_selector="reason=Scheduled"
            )
        except Exception as exc:
            raise api_error(exc, "list the pods' scheduling events") from None
        nodes = set()
        own_pod = re.compile(rf"^{re.escape(job_id)}-\d+-[a-z0-9]+$")
        for item in found.items or []:
            obj = item.involved_object
            if obj is None or obj.kind != "Pod" or not own_pod.fullmatch(obj.name or ""):
                continue
            match = _ASSIGNED.search(item.message or "")
            if match:
                nodes.add(match.group(1))
        self._nodes_seen.setdefault(job_id, set()).update(nodes)
        return nodes


_ASSIGNED = re.compile(r" to (\S+)$")


def run_records(lines: Iterator[str] | list[str], run: str) -> list[Event]:
    """The run events among a training process's stdout lines (``@tgnb {"kind": "events", ...}``)."""
    out = []
    for line in lines:
        record = parse_record(line)
        if record is None or record.pop("kind", None) != "events":
            continue
        ev = from_record(record)
        if ev is None:
            continue
        if ev.run is None:
            ev = Event(ev.time, ev.source, ev.reason, ev.message, ev.node, run, ev.data)
        out.append(ev)
    return out


def _split(text: str) -> Iterator[str]:
    yield from text.splitlines()


def _started(pod: Any) -> bool:
    """Whether the pod's trainer container has started (so that it has logs)."""
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.name == L.CONTAINER and cs.state is not None:
            return cs.state.running is not None or cs.state.terminated is not None
    return False
