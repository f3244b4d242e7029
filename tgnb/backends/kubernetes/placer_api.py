"""The run placer's API plumbing, for `KubernetesBackend`.

`PlacerApi` creates a placer's objects (`placer_objects`) in order — its ServiceAccount, Role and
RoleBinding, ClusterRole and ClusterRoleBinding, ConfigMap, then Deployment — recording each one
created so that a failed submit can delete them again; a 403 is one line that names the fix (a
policy that needs no placer, or the rights to create RBAC). It deletes objects by kind (the run's
ConfigMap and Service too), deletes a run's placer on cancel, and reads the placer's
``RecoveryDecided`` Events (`tgnb.backends.kubernetes.placer`) into `tgnb.events.Event`s.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.apierrors import api_error, event_time
from tgnb.backends.kubernetes.objects import RunObjects
from tgnb.backends.kubernetes.placer import DECISION_ANNOTATION
from tgnb.errors import AuthenticationError
from tgnb.events import RECOVERY_DECIDED, Event
from tgnb.runs.recovery import DECISION_DATA


class PlacerApi:
    """Create, delete and read a run's placer through the API clients of one namespace."""

    def __init__(self, core: Any, rbac: Any, apps: Any, namespace: str) -> None:
        self.core = core
        self.rbac = rbac
        self.apps = apps
        self.namespace = namespace

    def create(self, objs: RunObjects, created: list[tuple[str, str]]) -> None:
        """Create the run's placer objects in order, appending ``(kind, name)`` of each to
        `created`."""
        placer, ns = objs.placer, self.namespace
        assert placer is not None
        steps: list[tuple[str, Any, Any]] = [
            ("serviceaccount", self.core.create_namespaced_service_account, placer.service_account),
            ("role", self.rbac.create_namespaced_role, placer.role),
            ("rolebinding", self.rbac.create_namespaced_role_binding, placer.role_binding),
            ("clusterrole", self.rbac.create_cluster_role, placer.cluster_role),
            (
                "clusterrolebinding",
                self.rbac.create_cluster_role_binding,
                placer.cluster_role_binding,
            ),
            ("configmap", self.core.create_namespaced_config_map, placer.config_map),
            ("deployment", self.apps.create_namespaced_deployment, placer.deployment),
        ]
        for kind, create, obj in steps:
            try:
                create(obj) if kind.startswith("cluster") else create(ns, obj)
            except ApiException as exc:
                if exc.status == 403:
                    raise AuthenticationError(
                        f"the Kubernetes API refused to create the run's placer {kind} "
                        f"{obj.metadata.name!r} (403): its policy waits before standard nodes or "
                        "has a deadline, which needs a placer that reads the cluster's nodes; use "
                        "RecoveryPolicy(when_short='standard', wait_s=0) without a deadline, or ask "
                        "an admin for the rights to create Roles, ClusterRoles and their bindings",
                        403,
                    ) from None
                raise api_error(exc, f"create the run's placer {kind}") from None
            created.append((kind, obj.metadata.name))

    def delete(self, kind: str, name: str) -> None:
        """Delete one object of `kind` (``configmap``, ``service``, or a placer's kind)."""
        ns = self.namespace
        deletes: dict[str, Any] = {
            "configmap": lambda: self.core.delete_namespaced_config_map(name, ns),
            "service": lambda: self.core.delete_namespaced_service(name, ns),
            "serviceaccount": lambda: self.core.delete_namespaced_service_account(name, ns),
            "role": lambda: self.rbac.delete_namespaced_role(name, ns),
            "rolebinding": lambda: self.rbac.delete_namespaced_role_binding(name, ns),
            "clusterrole": lambda: self.rbac.delete_cluster_role(name),
            "clusterrolebinding": lambda: self.rbac.delete_cluster_role_binding(name),
            "deployment": lambda: self.apps.delete_namespaced_deployment(name, ns),
        }
        deletes[kind]()

    def delete_quietly(self, created: list[tuple[str, str]]) -> None:
        """Delete `created`, newest first, ignoring every failure."""
        for kind, obj in reversed(created):
            with contextlib.suppress(Exception):  # best effort: the error raised matters more
                self.delete(kind, obj)

    def delete_placer(self, job_id: str) -> None:
        """The run's placer, if it has one: its Deployment (which it may have deleted itself once
        the run finished) tells; its RBAC and ConfigMap follow."""
        name, cluster = L.placer_name(job_id), L.placer_cluster_name(self.namespace, job_id)
        found = False
        for kind, obj in (
            ("deployment", name),
            ("configmap", name),
            ("rolebinding", name),
            ("role", name),
            ("serviceaccount", name),
            ("clusterrolebinding", cluster),
            ("clusterrole", cluster),
        ):
            try:
                self.delete(kind, obj)
                found = True
            except ApiException as exc:
                if exc.status != 404:
                    raise api_error(exc, f"delete the placer's {kind} {obj!r}") from None
            if kind == "configmap" and not found:
                return  # neither its Deployment nor its config: the run has no placer

    def decisions(self, job_id: str) -> list[Event]:
        """The run's placer's decisions (``RecoveryDecided`` Events, `placer.KubePlacement.event`)."""
        try:
            found = self.core.list_namespaced_event(
                self.namespace,
                field_selector=f"reason={RECOVERY_DECIDED}",
                label_selector=f"{L.RUN_LABEL}={job_id}",
            )
        except Exception as exc:
            raise api_error(exc, "list the placer's decisions") from None
        out = []
        for item in found.items or []:
            labels = (item.metadata.labels or {}) if item.metadata else {}
            if item.reason != RECOVERY_DECIDED or labels.get(L.RUN_LABEL) != job_id:
                continue
            raw = ((item.metadata.annotations or {}) if item.metadata else {}).get(
                DECISION_ANNOTATION, "{}"
            )
            try:
                data = json.loads(raw)
            except ValueError:
                data = {}
            data = {k: data[k] for k in DECISION_DATA if isinstance(data, dict) and k in data}
            out.append(
                Event(event_time(item), "tgnb", RECOVERY_DECIDED, item.message or "", None,
                      job_id, data)
            )  # fmt: skip
        return out
