"""The objects of a run's placer (`tgnb.backends.kubernetes.placer`), built with the client's models.

A run whose recovery policy moves between node classes after a wait or by a deadline
(`labels.needs_placer`) has its pods held by a scheduling gate, and a placer that lifts it:

- a ConfigMap ``RUN-placer`` holding ``placer.json`` (the policy, the run's size, its launch time);
- a ServiceAccount, a Role (the namespace's pods: list, patch; events: create; the run's Job: get;
  its own Deployment: get, delete, to remove itself once the run's Job has finished) and its
  RoleBinding;
- a ClusterRole and ClusterRoleBinding ``tgnb-placer:NAMESPACE:RUN`` to list nodes and count the
  GPUs the pods of every namespace request on them (the free capacity of each class);
- a one-replica Deployment on a standard node (the seed's NotIn affinity: a preemption must not
  take the placer with the run), the run's image, 100m CPU and 256Mi, the run's directory mounted
  read-only from the shared claim so it reads the run's ``metrics.jsonl`` for a deadline.

Every object carries the run's labels. No secret reaches the placer: it gets none. The run's image
runs it, so a run with a placer needs ``tgnb[k8s]`` (the ``kubernetes`` client) in its image.

What the placer may do is the verbs its loop calls, no more; what remains wider than the run is
what RBAC cannot narrow. A rule names objects only by name (``resourceNames``), never by label,
and applies names to get, patch and delete but not to list: the run's Job and the placer's own
Deployment are named; the run's pods are not (the Job controller names them, ``RUN-INDEX-xxxxx``,
after the Role exists), so ``patch`` covers every pod of the namespace and ``list`` every pod of
the cluster (the free GPUs of a node are the sum of its pods' requests: no narrower object says
it). Since the run's image runs the placer, code in that image can patch the namespace's pods
(their labels and annotations, a gated pod's gates and affinity, a container's image: what the API
lets a pod update change) and read the pod specs of the cluster (env values included: secrets
belong in Secrets, which it cannot read). Narrower needs a ValidatingAdmissionPolicy that holds
the placer's account to the pods labelled with its run, a cluster administrator's object tgnb does
not create: run placers in a namespace of their own team.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tgnb.backends.base import RunSpec
from tgnb.backends.kubernetes import labels as L
from tgnb.runs.runfile import RunFile

RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class PlacerObjects:
    """The placer's objects, in the order they are created (the RBAC before its user)."""

    config_map: client.V1ConfigMap
    service_account: client.V1ServiceAccount
    role: client.V1Role
    role_binding: client.V1RoleBinding
    cluster_role: client.V1ClusterRole
    cluster_role_binding: client.V1ClusterRoleBinding
    deployment: client.V1Deployment

    def all(self) -> list[Any]:
        return [
            self.service_account,
            self.role,
            self.role_binding,
            self.cluster_role,
            self.cluster_role_binding,
            self.config_map,
            self.deployment,
        ]


def placer_config(spec: RunSpec, namespace: str, launched: float, poll_s: float = 5.0) -> str:
    """``placer.json``: a view of the run file (`tgnb.runs.runfile.RunFile.placer_config`), with
    the namespace, run directory and Deployment the placer works in."""
    run = RunFile(spec, launched)
    config = run.placer_config(
        poll_s,
        namespace=namespace,
        run_dir=L.run_dir_for(spec),
        deployment=L.placer_name(spec.name),
    )
    return config.to_json()


def standard_affinity() -> client.V1Affinity:
    """The seed's NotIn affinity: a node that is not preemptible."""
    not_preemptible = client.V1NodeSelectorRequirement(
        key=L.COMPUTE_CLASS_LABEL, operator="NotIn", values=[L.PREEMPTIBLE]
    )
    return client.V1Affinity(
        node_affinity=client.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[not_preemptible])]
            )
        )
    )


def _rule(
    group: str, resources: list[str], verbs: list[str], names: list[str] | None = None
) -> Any:
    return client.V1PolicyRule(
        api_groups=[group], resources=resources, verbs=verbs, resource_names=names
    )


def build_placer(
    spec: RunSpec,
    namespace: str,
    labels: dict[str, str],
    claim: str,
    launched: float | None = None,
) -> PlacerObjects:
    """The placer of `spec` (already validated by `build_objects`)."""
    name = L.placer_name(spec.name)
    cluster_name = L.placer_cluster_name(namespace, spec.name)
    launched = time.time() if launched is None else launched

    def meta(n: str, ns: str | None = namespace) -> client.V1ObjectMeta:
        return client.V1ObjectMeta(name=n, namespace=ns, labels=dict(labels))

    config_map = client.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=meta(name),
        data={L.PLACER_CONFIG_FILE: placer_config(spec, namespace, launched)},
    )
    account = client.V1ServiceAccount(api_version="v1", kind="ServiceAccount", metadata=meta(name))
    role = client.V1Role(
        api_version=f"{RBAC}/v1",
        kind="Role",
        metadata=meta(name),
        rules=[
            _rule("", ["pods"], ["list", "patch"]),  # unnamed: RBAC cannot narrow (see above)
            _rule("", ["events"], ["create"]),
            _rule("batch", ["jobs"], ["get"], [spec.name]),
            _rule("apps", ["deployments"], ["get", "delete"], [name]),
        ],
    )
    subject = client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=namespace)
    role_binding = client.V1RoleBinding(
        api_version=f"{RBAC}/v1",
        kind="RoleBinding",
        metadata=meta(name),
        role_ref=client.V1RoleRef(api_group=RBAC, kind="Role", name=name),
        subjects=[subject],
    )
    cluster_role = client.V1ClusterRole(
        api_version=f"{RBAC}/v1",
        kind="ClusterRole",
        metadata=meta(cluster_name, None),
        rules=[_rule("", ["nodes"], ["list"]), _rule("", ["pods"], ["list"])],
    )
    cluster_role_binding = client.V1ClusterRoleBinding(
        api_version=f"{RBAC}/v1",
        kind="ClusterRoleBinding",
        metadata=meta(cluster_name, None),
        role_ref=client.V1RoleRef(api_group=RBAC, kind="ClusterRole", name=cluster_name),
        subjects=[subject],
    )
    config_path = f"{L.CONFIG_DIR}/{L.PLACER_CONFIG_FILE}"
    # not the run's label: the run's pods (its status, its Service) are those that carry it
    pod_labels = {L.MANAGED_BY_LABEL: L.MANAGED_BY, L.PLACER_LABEL: spec.name}
    container = client.V1Container(
        name=L.PLACER_CONTAINER,
        image=spec.image,
        command=["python", "-m", "tgnb.backends.kubernetes.placer", config_path],
        env=[client.V1EnvVar(name="PYTHONUNBUFFERED", value="1")],
        resources=client.V1ResourceRequirements(
            requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "256Mi"}
        ),
        volume_mounts=[
            client.V1VolumeMount(name="config", mount_path=L.CONFIG_DIR, read_only=True),
            client.V1VolumeMount(
                name="runs", mount_path=L.run_dir_for(spec), sub_path=spec.name, read_only=True
            ),
        ],
    )
    pod = client.V1PodSpec(
        service_account_name=name,
        affinity=standard_affinity(),
        containers=[container],
        volumes=[
            client.V1Volume(name="config", config_map=client.V1ConfigMapVolumeSource(name=name)),
            client.V1Volume(
                name="runs",
                # read-only at the mount only: the kubelet creates a missing sub-directory (the
                # placer may start before the run's first pod) in the volume, which must be writable
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                    claim_name=claim
                ),
            ),
        ],
    )
    deployment = client.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=meta(name),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels={L.PLACER_LABEL: spec.name}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=pod_labels), spec=pod
            ),
        ),
    )
    return PlacerObjects(
        config_map, account, role, role_binding, cluster_role, cluster_role_binding, deployment
    )
