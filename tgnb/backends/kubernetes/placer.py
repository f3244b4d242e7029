"""The placer: the part of a Kubernetes run's recovery policy that acts while the run's pods wait.

The scheduler alone places a pod at once, wherever it fits: it can prefer preemptible nodes
(``when_short="standard"`` with ``wait_s=0`` is that), not wait `RecoveryPolicy.wait_s` for them
first, and it knows nothing of a run's progress. So a run whose policy moves between node classes
after a wait or by a deadline (`labels.needs_placer`) has a scheduling gate
(``tgnb.together.ai/placement``, Pod Scheduling Readiness, GA in 1.30) on its Job's pod template
and no compute class: every pod the Job controller creates, the first and each one recreated
after a preemption, waits for one placement. A small Deployment on a standard node
(`placer_objects`) runs ``python -m tgnb.backends.kubernetes.placer /config/placer.json``.

Every few seconds it lists the run's gated pods and, while there are some, the cluster's nodes:
each node is of the class its ``together.ai/compute-class`` label says (Together's standard nodes
carry none), free when it is Ready, not cordoned, has no NoSchedule/NoExecute taint the pod does
not tolerate, and has the GPUs the run needs on each node left (allocatable ``nvidia.com/gpu``
less what the unfinished pods bound there request). With those, how long the oldest gated pod has
waited and the run's own progress (its ``metrics.jsonl``, mounted read-only) it calls the one rule
every engine follows (`tgnb.runs.recovery.decide`) and, on ``start``, patches every gated pod
(a JSON patch: the gate removed, and a nodeSelector ``together.ai/compute-class: preemptible`` or
the seed's NotIn affinity added, both allowed on a gated pod); on ``wait`` it leaves them gated.

While a run's pods run on standard nodes (placed there with the NotIn affinity), the placer reads
the nodes too: as soon as the rule would start them on preemptible nodes (back to preemptible),
it deletes them (the kubelet sends SIGTERM: they checkpoint and exit 75, which the Job's
podFailurePolicy ignores), and the Job controller creates them again, gated, for a placement on
preemptible nodes.

The loop is the one every engine runs (`tgnb.runs.placing.PlacementLoop`; `KubePlacement` is
its `Engine`). Each
decision, once per change, is a core/v1 Event (reason ``RecoveryDecided``) on the pod, its
fields in an annotation; `KubernetesBackend.events` puts them on the run's timeline. (The run's
``events.jsonl`` is on the shared claim, which the placer mounts read-only: it writes nothing
there.) Once the run's Job has finished or is gone, the placer deletes its own Deployment.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.placer_objects import standard_affinity
from tgnb.errors import ValidationError
from tgnb.events import RECOVERY_DECIDED, utcnow
from tgnb.runs import placing
from tgnb.runs.recovery import Decision, Facts, NodeClass, progress
from tgnb.runs.runfile import PlacerConfig

GPU = "nvidia.com/gpu"
#: The annotation of a ``RecoveryDecided`` Event holding the decision's fields as JSON.
DECISION_ANNOTATION = "tgnb.together.ai/decision"
PREEMPTIBLE = L.PREEMPTIBLE
#: How long a placer waits for its run's Job to appear before it takes it for gone.
JOB_GRACE_S = 600.0


# -- what the placer sees -------------------------------------------------------------------------


def _tolerates(tolerations: Sequence[Any], taint: Any) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == taint.key):
            return True
        if t.key == taint.key and (t.value or "") == (taint.value or ""):
            return True
    return False


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_class(n: Any) -> str:
    labels = (n.metadata.labels or {}) if n.metadata else {}
    return PREEMPTIBLE if labels.get(L.COMPUTE_CLASS_LABEL) == PREEMPTIBLE else "standard"


def gpus_requested(pods: Sequence[Any]) -> dict[str, int]:
    """GPUs the unfinished pods request on each node they are bound to (an extended resource's
    limit is its request)."""
    out: dict[str, int] = {}
    for p in pods:
        node = p.spec.node_name if p.spec else None
        phase = p.status.phase if p.status else None
        if not node or phase in ("Succeeded", "Failed"):
            continue
        for c in p.spec.containers or []:
            res = c.resources
            want = (res.requests or {}).get(GPU) or (res.limits or {}).get(GPU) if res else None
            out[node] = out.get(node, 0) + _quantity(want)
    return out


def usable(n: Any, tolerations: Sequence[Any]) -> bool:
    """Ready, not cordoned, and no taint that keeps the run's pod off."""
    if n.spec and n.spec.unschedulable:
        return False
    conditions = (n.status.conditions or []) if n.status else []
    if not any(c.type == "Ready" and c.status == "True" for c in conditions):
        return False
    taints = (n.spec.taints or []) if n.spec else []
    return all(
        t.effect not in ("NoSchedule", "NoExecute") or _tolerates(tolerations, t) for t in taints
    )


def free_nodes(
    nodes: Sequence[Any], used: Mapping[str, int], gpus: int, tolerations: Sequence[Any]
) -> dict[str, int]:
    """The nodes of each class that could take one of the run's pods now."""
    free = {PREEMPTIBLE: 0, "standard": 0}
    for n in nodes:
        if not usable(n, tolerations):
            continue
        allocatable = _quantity(((n.status.allocatable or {}) if n.status else {}).get(GPU))
        if gpus and allocatable - used.get(n.metadata.name, 0) < gpus:
            continue
        free[node_class(n)] += 1
    return free


def gated(pod: Any) -> bool:
    return any(g.name == L.PLACEMENT_GATE for g in (pod.spec.scheduling_gates or []))


def placed_standard(pod: Any) -> bool:
    """Whether `pod` runs where a placement on standard nodes put it (`placement_patch`'s NotIn
    affinity on the compute class)."""
    if not pod.spec.node_name or (pod.status and pod.status.phase != "Running"):
        return False
    affinity = pod.spec.affinity.node_affinity if pod.spec.affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    return any(
        e.key == L.COMPUTE_CLASS_LABEL and e.operator == "NotIn" and PREEMPTIBLE in (e.values or [])
        for t in (required.node_selector_terms or [] if required else [])
        for e in t.match_expressions or []
    )


def kube_facts(
    config: PlacerConfig,
    pods: Sequence[Any],
    nodes: Sequence[Any],
    all_pods: Sequence[Any],
    run_dir: str | Path,
    now: float,
) -> Facts:
    """`tgnb.runs.recovery.Facts` of a run's gated pods (`pods`): one placement for all of them."""
    gpus = config.gpus_per_node
    tolerations = (pods[0].spec.tolerations or []) if pods else []
    free = free_nodes(nodes, gpus_requested(all_pods), gpus, tolerations)
    oldest = min(_seconds(p.metadata.creation_timestamp, now) for p in pods) if pods else now
    want = min(len(pods), config.nodes) or config.nodes
    least = config.min_nodes
    preemptible_up = [n for n in nodes if node_class(n) == PREEMPTIBLE and usable(n, tolerations)]
    allocated = sum(_quantity((n.status.allocatable or {}).get(GPU)) for n in preemptible_up)
    return Facts(
        nodes=want,
        min_nodes=min(int(least), want) if least else None,
        free=free,
        short_for_s=max(0.0, now - oldest),
        allocated_gpus=allocated if gpus else None,
        desired_gpus=want * gpus if gpus else None,
        gpus_per_node=gpus,
        **progress(run_dir, config.launched, config.max_steps, now),
    )


def _seconds(value: Any, now: float) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return now


def placement_patch(pod: Any, node_class_: str) -> list[dict[str, Any]]:
    """The JSON patch that places `pod` on `node_class_` and lifts tgnb's gate (other gates stay).
    On a gated pod Kubernetes allows adding nodeSelector entries, setting an affinity that was
    unset, and removing gates."""
    ops: list[dict[str, Any]] = []
    gates = pod.spec.scheduling_gates or []
    for i, g in reversed(list(enumerate(gates))):
        if g.name == L.PLACEMENT_GATE:
            ops.append({"op": "remove", "path": f"/spec/schedulingGates/{i}"})
    if node_class_ == PREEMPTIBLE:
        if pod.spec.node_selector:
            key = L.COMPUTE_CLASS_LABEL.replace("~", "~0").replace("/", "~1")
            ops.append({"op": "add", "path": f"/spec/nodeSelector/{key}", "value": PREEMPTIBLE})
        else:
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/nodeSelector",
                    "value": {L.COMPUTE_CLASS_LABEL: PREEMPTIBLE},
                }
            )
    else:
        body = client.ApiClient().sanitize_for_serialization(standard_affinity())
        if pod.spec.affinity is None:
            ops.append({"op": "add", "path": "/spec/affinity", "value": body})
        elif pod.spec.affinity.node_affinity is None:
            ops.append(
                {"op": "add", "path": "/spec/affinity/nodeAffinity", "value": body["nodeAffinity"]}
            )
        else:  # only additions to what is there are allowed: the NotIn to each term
            required = (
                pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
            )
            term = body["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            if required is None or not required.node_selector_terms:
                path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
                ops.append({"op": "add", "path": path, "value": term})
            else:
                expr = term["nodeSelectorTerms"][0]["matchExpressions"][0]
                for i, t in enumerate(required.node_selector_terms):
                    base = f"/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/{i}/matchExpressions"
                    if t.match_expressions:
                        ops.append({"op": "add", "path": f"{base}/-", "value": expr})
                    else:
                        ops.append({"op": "add", "path": base, "value": [expr]})
    return ops


# -- the loop -------------------------------------------------------------------------------------


class KubePlacement:
    """Places the pods of one run with the settings of its ``placer.json`` (`config`): the
    `tgnb.runs.placing.Engine` of a Kubernetes run, run by the one placement loop."""

    def __init__(self, config: PlacerConfig, api_client: Any, run_dir: str | Path | None = None):
        if config.namespace is None:
            raise ValidationError("placer.json has no 'namespace': not a Kubernetes run's")
        self.config = config
        self.name = config.run
        self.namespace = config.namespace
        self.policy = config.policy
        self.run_dir = Path(run_dir or config.run_dir or ".")
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.started = time.time()
        self.job_seen = False
        self.finished = False  # the run's Job has finished or is gone: the loop ends
        self.now = self.started  # of the current step (`tick`)
        self.pods: list[Any] = []  # the gated pods the current step places, or those it moves
        self.loop = placing.PlacementLoop(self.policy, self)

    def event(self, d: Decision, pod: Any) -> None:
        """The decision as a ``RecoveryDecided`` Event on `pod` (the run's timeline reads it)."""
        data = d.data()
        now = utcnow()
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{self.name}-recovery-",
                namespace=self.namespace,
                labels={L.MANAGED_BY_LABEL: L.MANAGED_BY, L.RUN_LABEL: self.name},
                annotations={DECISION_ANNOTATION: json.dumps(data, sort_keys=True)},
            ),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=pod.metadata.name,
                namespace=self.namespace,
                uid=pod.metadata.uid,
            ),
            reason=RECOVERY_DECIDED,
            message=d.reason,
            type="Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="tgnb-placer"),
        )
        try:
            self.core.create_namespaced_event(self.namespace, body)
        except ApiException as exc:  # the decision stands; only its record is lost
            print(f"tgnb placer: could not record the decision ({exc.status})", flush=True)
        print(f"tgnb placer: {d.reason}", flush=True)

    def job_finished(self, now: float | None = None) -> bool:
        """Whether the run's Job has finished or is gone. The placer is created before the Job:
        a Job not there yet is gone only once it was seen, or `JOB_GRACE_S` after the placer
        started (a submit that failed half-way and could not clean up)."""
        now = time.time() if now is None else now
        try:
            job = self.batch.read_namespaced_job(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self.job_seen or now - self.started >= JOB_GRACE_S
        self.job_seen = True
        for c in (job.status.conditions or []) if job.status else []:
            if c.type in ("Complete", "Failed") and c.status == "True":
                return True
        return False

    def observe(self) -> Facts | None:
        """The facts of the run's gated pods (one placement for all of them), or of its pods
        running on standard nodes; None when there is nothing to place (or the Job has finished:
        the loop ends). The API not answering is `placing.NoAnswer`."""
        try:
            if self.job_finished():
                self.finished = True
                return None
            return self._observe()
        except ApiException as exc:  # the API server is busy or restarting: look again
            print(f"tgnb placer: the API answered {exc.status}", flush=True)
            raise placing.NoAnswer from exc

    def _observe(self) -> Facts | None:
        found = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{L.RUN_LABEL}={self.name}"
        )
        items: list[Any] = [
            p for p in found.items or [] if not p.metadata or not p.metadata.deletion_timestamp
        ]
        self.pods = [p for p in items if gated(p)]
        current: NodeClass | None = None
        if not self.pods:
            self.pods = [p for p in items if placed_standard(p)]
            current = "standard"
        if not self.pods:
            return None
        nodes = self.core.list_node().items or []
        everyone = (
            self.core.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed"
            ).items
            or []
        )
        f = kube_facts(self.config, self.pods, nodes, everyone, self.run_dir, self.now)
        return dataclasses.replace(f, current=current)

    def act(self, d: Decision) -> Decision:
        """On ``start``, every gated pod gets the class decided and loses its gate; a pod that
        goes back to preemptible nodes is deleted (its Job creates it again, gated)."""
        if d.action != "start":
            return d
        for pod in self.pods:  # one placement: every pod gets the same class
            try:
                if gated(pod):
                    self.core.patch_namespaced_pod(
                        pod.metadata.name, self.namespace, placement_patch(pod, d.node_class)
                    )
                else:
                    self.core.delete_namespaced_pod(pod.metadata.name, self.namespace)
            except ApiException as exc:  # deleted meanwhile: its replacement comes gated
                print(
                    f"tgnb placer: could not place {pod.metadata.name} ({exc.status})",
                    flush=True,
                )
        return d

    def record(self, d: Decision) -> None:
        self.event(d, self.pods[0])

    def done(self) -> bool:
        return self.finished

    def tick(self, now: float | None = None) -> Decision | None:
        """One step of the placement loop; the decision when some pods were gated (or ran on
        standard nodes)."""
        self.now = time.time() if now is None else now
        return self.loop.step()

    def run(self) -> int:
        print(f"tgnb placer: placing the pods of run {self.name}", flush=True)
        self.loop.run(self.config.poll_s, sleep=self._sleep)
        print(f"tgnb placer: run {self.name} has finished; removing the placer", flush=True)
        name = self.config.deployment or L.placer_name(self.name)
        try:
            self.apps.delete_namespaced_deployment(name, self.namespace)
        except ApiException as exc:
            print(f"tgnb placer: could not delete {name} ({exc.status})", flush=True)
        return 0

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)
        self.now = time.time()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tgnb.backends.kubernetes.placer PLACER_JSON", file=sys.stderr)
        return 2
    from kubernetes import config as kube_config

    kube_config.load_incluster_config()
    return KubePlacement(PlacerConfig.load(args[0]), client.ApiClient()).run()


if __name__ == "__main__":
    sys.exit(main())
