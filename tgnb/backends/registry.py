"""Choose the workload backend for an attached cluster.

A cluster served by the local emulator (known from the attach: the session's `tgnb.connection`
endpoint has the emulator's own operations) gets the ``local`` backend (processes on its emulated
nodes); otherwise a SLURM-type cluster gets ``slurm`` (sbatch, here or on a login node over SSH)
and a KUBERNETES-type cluster gets ``kubernetes`` (from the cluster's ``kube_config``). An explicit
override (a name, or a `Backend` object) wins.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tgnb.backends.base import Backend
from tgnb.errors import ValidationError

if TYPE_CHECKING:
    from tgnb.cloud import Cloud, ClusterState
    from tgnb.runs.store import RunStore


def backend_name(state: ClusterState, local: bool, override: str | None = None) -> str:
    """The name of the backend for a cluster: the override, else ``local`` on the local emulator
    (`local`: the session attached to it), else by the cluster's type."""
    if override is not None:
        if override not in FACTORIES:
            raise ValidationError(
                f"unknown backend {override!r}: use one of {', '.join(FACTORIES)}"
            )
        return override
    if local:
        return "local"
    kind = state.type.upper()
    if kind == "SLURM":
        return "slurm"
    if kind == "KUBERNETES":
        return "kubernetes"
    raise ValidationError(
        f"cluster {state.name} has type {state.type!r}: pass backend='slurm' or 'kubernetes'"
    )


def _local(cloud: Cloud, state: ClusterState, store: RunStore, **options: Any) -> Backend:
    from tgnb.backends.local import LocalBackend

    key = cloud.settings.api_key.get() if cloud.settings.api_key else None
    return LocalBackend(
        store,
        cluster_id=state.id,
        cluster_type=state.type or "KUBERNETES",
        base_url=cloud.base_url,
        api_key=key,
        **options,
    )


def _slurm(cloud: Cloud, state: ClusterState, store: RunStore, **options: Any) -> Backend:
    from tgnb.backends.slurm import SlurmBackend

    options.setdefault("host", os.environ.get("TGNB_SLURM_HOST") or None)
    return SlurmBackend(**options)


def _kubernetes(cloud: Cloud, state: ClusterState, store: RunStore, **options: Any) -> Backend:
    from tgnb.backends.kubernetes.backend import KubernetesBackend

    raw = cloud.client.clusters.retrieve(state.id)
    return KubernetesBackend.from_kube_config(
        getattr(raw, "kube_config", None), cluster=state.name, **options
    )


#: The engines by name: each builds its backend from the attached cluster (its module imported
#: only then, so the notebook side stays light).
FACTORIES: dict[str, Callable[..., Backend]] = {
    "local": _local,
    "slurm": _slurm,
    "kubernetes": _kubernetes,
}


def choose_backend(
    cloud: Cloud,
    state: ClusterState,
    store: RunStore,
    override: str | Backend | None = None,
    *,
    local: bool,
    **options: Any,
) -> Backend:
    """Build the backend for `state`'s cluster. `options` go to the backend's constructor.

    Slurm: ``host`` (a login node for SSH; default ``$TGNB_SLURM_HOST`` or this machine),
    ``runs_root``, ``gres``, ``python``. Kubernetes: ``namespace``, ``context`` and the
    `KubernetesBackend` options. Local: ``poll``. `local`: the session attached to the local
    emulator (`backend_name`).
    """
    if override is not None and not isinstance(override, str):
        return override
    name = backend_name(state, local, override)
    return FACTORIES[name](cloud, state, store, **options)
