"""The Kubernetes workload backend (needs ``tgnb[k8s]``).

Importing this package does not import the ``kubernetes`` client; `KubernetesBackend`,
`build_objects` and `api_client_from_kube_config` load it when first used.
"""

from __future__ import annotations

from typing import Any

from tgnb.backends.kubernetes.labels import restart_count_from_env, validate_spec

__all__ = [
    "KubernetesBackend",
    "api_client_from_kube_config",
    "build_objects",
    "restart_count_from_env",
    "validate_spec",
]


def __getattr__(name: str) -> Any:
    if name == "KubernetesBackend":
        from tgnb.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend
    if name == "build_objects":
        from tgnb.backends.kubernetes.objects import build_objects

        return build_objects
    if name == "api_client_from_kube_config":
        from tgnb.backends.kubernetes.kubeconfig import api_client_from_kube_config

        return api_client_from_kube_config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
