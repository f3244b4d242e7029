"""The emulated fleet's state and the JSON shapes the clusters API answers with.

A `FleetCluster` holds what the platform knows about one GPU cluster: its request (standard GPUs,
the preemptible target), its nodes and its ``node_lifecycle_events``. `cluster_to_api` renders it
as the ``Cluster`` object of the together SDK 3.1.1 (``together.types.Cluster``): every required
field is present, timestamps are RFC 3339 in UTC.

Nodes have 8 GPUs each. Standard nodes are named ``gpu-dp-<short>-<n>``, preemptible ones
``gpu-preemptible-dp-<short>-<n>`` (``<short>`` is the first 8 characters of the cluster id, ``n``
counts up and is never reused). A node's ``node_id`` and ``host_name`` are both its name, which is
also what ``node_lifecycle_events[].node_id`` holds.

Node states (the emulator's own word, shown by the admin endpoint ``/_emulator/clusters/{id}/nodes``):
``provisioning`` (asked for, not live yet), ``running`` (live), ``draining`` (preemption notified,
the drain window is open; still live and still counted in ``allocated_preemptible_gpus``) and
``removed`` (gone; listed in ``deleted_gpu_worker_nodes``).

``kube_config`` of a KUBERNETES cluster is a base64 kubeconfig pointing at
``https://127.0.0.1:6443``: there is NO Kubernetes API server behind it. It exists so that code that
decodes credentials (``tg clusters get-credentials``) has something well-formed to decode.
SLURM clusters answer ``""``.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from tgnb import prices
from tgnb.events import format_time, parse_time
from tgnb.runs.spec import GPUS_PER_NODE

GPU_TYPES = (
    "H100_SXM",
    "H200_SXM",
    "RTX_6000_PCI",
    "L40_PCIE",
    "B200_SXM",
    "H100_SXM_INF",
    "B300_SXM",
    "GB200_SXM",
)
BILLING_TYPES = ("RESERVED", "ON_DEMAND", "SCHEDULED_CAPACITY")
CLUSTER_TYPES = ("KUBERNETES", "SLURM")

#: The region catalog (``GET /v1/compute/regions``): name -> supported GPU types.
REGIONS: dict[str, tuple[str, ...]] = {
    "us-central-2": GPU_TYPES,
    "us-central-8": ("H100_SXM", "H200_SXM", "B200_SXM"),
    "us-west-1": ("H100_SXM", "RTX_6000_PCI", "L40_PCIE"),
    "eu-north-1": ("H100_SXM", "H200_SXM"),
}
#: (id, cuda_version, nvidia_driver_version, os) offered in every region.
DRIVER_VERSIONS: tuple[tuple[str, str, str, str], ...] = (
    ("nv-570-cuda-12.8-ubuntu-22.04", "12.8", "570", "ubuntu-22.04"),
    ("nv-565-cuda-12.7-ubuntu-22.04", "12.7", "565", "ubuntu-22.04"),
    ("nv-550-cuda-12.4-ubuntu-22.04", "12.4", "550", "ubuntu-22.04"),
)

#: The identity behind any accepted key (``GET /v3/whoami``) and its default project.
ORG_ID = "org-tgnb-emulator"
ORG_NAME = "tgnb emulator"
DEFAULT_PROJECT_ID = "proj-tgnb-emulator"

PROVISIONING, RUNNING, DRAINING, REMOVED = "provisioning", "running", "draining", "removed"
STANDARD, PREEMPTIBLE = "standard", "preemptible"

_CLUSTER_PHASES = (
    "CLUSTER_PHASE_QUEUED",
    "CLUSTER_PHASE_SCHEDULED",
    "CLUSTER_PHASE_WAITING_FOR_CONTROL_PLANE_NODES",
    "CLUSTER_PHASE_WAITING_FOR_DATA_PLANE_NODES",
    "CLUSTER_PHASE_INSTALLING_DRIVERS",
    "CLUSTER_PHASE_READY",
)


@dataclass
class FleetNode:
    """One GPU worker node. Times are POSIX seconds (real clock); None when not reached yet."""

    name: str
    kind: str  # STANDARD | PREEMPTIBLE
    state: str  # PROVISIONING | RUNNING | DRAINING | REMOVED
    requested_at: float
    ready_at: float  # when provisioning ends (planned while provisioning)
    notified_at: float | None = None  # preemption notice (T+0)
    deadline: float | None = None  # end of the drain window (T+window)
    removed_at: float | None = None
    removed_reason: str | None = None
    preempt_at: float | None = None  # scheduled random preemption, if any
    phases: list[tuple[str, float]] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.state in (RUNNING, DRAINING)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FleetNode:
        d = dict(d)
        d["phases"] = [(str(p), float(t)) for p, t in d.get("phases", [])]
        return cls(**d)


@dataclass
class LifecycleEvent:
    """One ``node_lifecycle_events`` item; `time` is POSIX seconds."""

    node: str
    reason: str
    message: str
    time: float

    def to_api(self) -> dict[str, Any]:
        return {
            "node_id": self.node,
            "reason": self.reason,
            "message": self.message,
            "timestamp": rfc3339(self.time),
        }


@dataclass
class FleetCluster:
    """What the platform knows about one cluster: its request, nodes and lifecycle events."""

    cluster_id: str
    cluster_name: str
    cluster_type: str
    region: str
    gpu_type: str
    billing_type: str
    project_id: str
    num_gpus: int
    desired_preemptible_gpus: int
    cuda_version: str
    nvidia_driver_version: str
    nvidia_version_id: str
    created_at: float
    num_reserved_gpus: int = 0
    num_capacity_pool_gpus: int = 0
    capacity_pool_id: str | None = None
    duration_days: int | None = None
    capacity_gpus: int | None = None  # per-cluster preemptible capacity cap (admin knob)
    nodes: list[FleetNode] = field(default_factory=list)
    events: list[LifecycleEvent] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    add_ons: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # other create fields, echoed back

    @classmethod
    def from_create(
        cls, body: dict[str, Any], cluster_id: str, now: float, default_project: str
    ) -> FleetCluster:
        """A new cluster (no nodes yet) from a validated create body."""
        return cls(
            cluster_id=cluster_id,
            cluster_name=body["cluster_name"],
            cluster_type=body.get("cluster_type") or "KUBERNETES",
            region=body["region"],
            gpu_type=body["gpu_type"],
            billing_type=body["billing_type"],
            project_id=body.get("project_id") or default_project,
            num_gpus=0,
            desired_preemptible_gpus=body.get("num_preemptible_gpus") or 0,
            cuda_version=body["cuda_version"],
            nvidia_driver_version=body["nvidia_driver_version"],
            nvidia_version_id=body["nvidia_version_id"],
            created_at=now,
            num_reserved_gpus=body.get("num_reserved_gpus") or 0,
            num_capacity_pool_gpus=body.get("num_capacity_pool_gpus") or 0,
            capacity_pool_id=body.get("capacity_pool_id"),
            duration_days=body.get("duration_days"),
            add_ons=add_ons_from_body(body.get("add_ons")),
            volumes=_volumes(body),
            extra={k: v for k, v in body.items() if k not in _STATE_FIELDS and v is not None},
        )

    @property
    def short(self) -> str:
        return self.cluster_id.replace("-", "")[:8]

    def live_nodes(self, kind: str | None = None) -> list[FleetNode]:
        return [n for n in self.nodes if n.state != REMOVED and (kind is None or n.kind == kind)]

    def node(self, name: str) -> FleetNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def allocated_preemptible_gpus(self) -> int:
        """Preemptible GPUs live now: running and draining nodes (a draining node counts until removed)."""
        return GPUS_PER_NODE * sum(1 for n in self.live_nodes(PREEMPTIBLE) if n.live)

    def next_name(self, kind: str) -> str:
        n = self.counters.get(kind, 0)
        self.counters[kind] = n + 1
        prefix = "gpu-dp" if kind == STANDARD else "gpu-preemptible-dp"
        return f"{prefix}-{self.short}-{n}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = [n.to_dict() for n in self.nodes]
        d["events"] = [asdict(e) for e in self.events]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FleetCluster:
        d = dict(d)
        d["nodes"] = [FleetNode.from_dict(n) for n in d.get("nodes", [])]
        d["events"] = [LifecycleEvent(**e) for e in d.get("events", [])]
        return cls(**d)


#: create-body fields held in `FleetCluster`'s own attributes (the rest go to `extra`, echoed back)
_STATE_FIELDS = frozenset(
    {
        "cluster_name",
        "cluster_type",
        "region",
        "gpu_type",
        "billing_type",
        "project_id",
        "num_gpus",
        "num_preemptible_gpus",
        "cuda_version",
        "nvidia_driver_version",
        "nvidia_version_id",
        "num_reserved_gpus",
        "num_capacity_pool_gpus",
        "capacity_pool_id",
        "duration_days",
        "add_ons",
        "volume_id",
        "shared_volume",
        "volume",
    }
)


def add_ons_from_body(raw: Any) -> list[dict[str, Any]]:
    """The ``add_ons`` of a validated create or update body, as a Cluster shows them."""
    out = []
    for a in raw or []:
        if isinstance(a, dict) and a.get("name"):
            out.append(
                {
                    "add_on_type": a.get("add_on_type", a["name"]),
                    "name": a["name"],
                    "config": a.get("config") or {},
                    "state": {},
                }
            )
    return out


def _volumes(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The cluster's volumes: ``volume`` is the one `tgnb.emulator.volumes` resolved (from
    ``volume_id`` or made for ``shared_volume``)."""
    if isinstance(body.get("volume"), dict):
        return [dict(body["volume"], status="bound")]
    sv = body.get("shared_volume")
    if isinstance(sv, dict) and sv.get("volume_name"):
        return [
            {
                "volume_id": f"vol-{uuid.uuid4().hex[:12]}",
                "volume_name": sv["volume_name"],
                "size_tib": int(sv.get("size_tib") or 1),
                "status": "Available",
            }
        ]
    return []


def rfc3339(t: float) -> str:
    return format_time(parse_time(t))


def _node_phase(node: FleetNode) -> str:
    return node.phases[-1][0] if node.phases else "NODE_PHASE_PENDING"


_NODE_STATUS = {
    PROVISIONING: "Provisioning",
    RUNNING: "Ready",
    DRAINING: "Draining",
    REMOVED: "Deleted",
}


def node_to_api(node: FleetNode, cluster: FleetCluster) -> dict[str, Any]:
    """A ``GPUWorkerNode`` (or ``DeletedGPUWorkerNode``) object."""
    out: dict[str, Any] = {
        "node_id": node.name,
        "host_name": node.name,
        "instance_id": f"i-{node.name}",
        "status": _NODE_STATUS[node.state],
        "num_gpus": GPUS_PER_NODE,
        "num_cpu_cores": 128,
        "memory_gib": 2048.0,
        "networks": ["10.0.0.0/16"],
        "phase_transitions": [{"phase": p, "transition_time": rfc3339(t)} for p, t in node.phases],
        "marked_for_deletion": node.state == DRAINING,
    }
    if cluster.cluster_type == "SLURM":
        out["slurm_worker_hostname"] = node.name
    if node.removed_at is not None:
        out["deleted_at"] = rfc3339(node.removed_at)
    return out


def kubeconfig(cluster: FleetCluster) -> str:
    """A base64 kubeconfig for a KUBERNETES cluster; no API server answers at its address."""
    if cluster.cluster_type != "KUBERNETES":
        return ""
    import yaml

    name = str(cluster.cluster_name)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True},
            }
        ],
        "users": [{"name": f"{name}-admin", "user": {"token": "tgnb-emulator-no-api-server"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
    }
    # a YAML library, never string insertion: no name can add a server or a user
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return base64.b64encode(text.encode()).decode()


def cluster_to_api(cluster: FleetCluster, include_events: bool = True) -> dict[str, Any]:
    """The ``Cluster`` object of together 3.1.1, every required field present."""
    created = cluster.created_at
    live = [n for n in cluster.nodes if n.state != REMOVED]
    removed = [n for n in cluster.nodes if n.state == REMOVED]
    rates = prices.published(cluster.gpu_type)
    out: dict[str, Any] = {
        "cluster_id": cluster.cluster_id,
        "cluster_name": cluster.cluster_name,
        "cluster_type": cluster.cluster_type,
        "region": cluster.region,
        "gpu_type": cluster.gpu_type,
        "billing_type": cluster.billing_type,
        "status": "Ready",
        "project_id": cluster.project_id,
        "num_gpus": cluster.num_gpus,
        "num_reserved_gpus": cluster.num_reserved_gpus,
        "num_capacity_pool_gpus": cluster.num_capacity_pool_gpus,
        "num_cpu_workers": 0,
        "desired_preemptible_gpus": cluster.desired_preemptible_gpus,
        "allocated_preemptible_gpus": cluster.allocated_preemptible_gpus,
        "cuda_version": cluster.cuda_version,
        "nvidia_driver_version": cluster.nvidia_driver_version,
        "nvidia_version_id": cluster.nvidia_version_id,
        "kube_config": kubeconfig(cluster),
        "volumes": list(cluster.volumes),
        "control_plane_nodes": [
            {
                "node_id": f"cp-{cluster.short}-0",
                "host_name": f"cp-{cluster.short}-0",
                "network": "10.0.0.0/16",
                "num_cpu_cores": 16,
                "memory_gib": 64.0,
                "status": "Ready",
                "phase_transitions": [
                    {"phase": "NODE_PHASE_RUNNING", "transition_time": rfc3339(created)}
                ],
            }
        ],
        "gpu_worker_nodes": [node_to_api(n, cluster) for n in live],
        "deleted_gpu_worker_nodes": [node_to_api(n, cluster) for n in removed],
        "phase_transitions": [
            {"phase": p, "transition_time": rfc3339(created)} for p in _CLUSTER_PHASES
        ],
        "add_ons": list(cluster.add_ons),
        "created_at": rfc3339(created),
        "first_ready_at": rfc3339(created),
        "control_plane_ready": True,
        "capacity_pool_id": cluster.capacity_pool_id,
        "duration_hours": cluster.duration_days * 24 if cluster.duration_days else None,
        "ums_project_id": cluster.project_id,
        "ums_org_id": ORG_ID,
        # not in together 3.1.1's Cluster: the emulator serves its GPU type's published rates
        # (`tgnb.prices`), which the client reads where an API gives them
        "pricing": None if rates is None else rates.to_api(),
    }
    if include_events:
        out["node_lifecycle_events"] = [
            e.to_api() for e in sorted(cluster.events, key=lambda e: e.time)
        ]
    out.update({k: v for k, v in cluster.extra.items() if k not in out})
    return out


_RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "cluster_id": str,
    "cluster_name": str,
    "cluster_type": str,
    "region": str,
    "gpu_type": str,
    "billing_type": str,
    "project_id": str,
    "num_gpus": int,
    "desired_preemptible_gpus": int,
    "cuda_version": str,
    "nvidia_driver_version": str,
    "nvidia_version_id": str,
    "created_at": (int, float),
    "num_reserved_gpus": int,
    "num_capacity_pool_gpus": int,
    "duration_days": (int, type(None)),
    "capacity_gpus": (int, type(None)),
}


def check_record(cluster: FleetCluster) -> None:
    """Raise ValueError unless a (stored) cluster has the types the API renders it with."""
    import json

    for name, kind in _RECORD_TYPES.items():
        value = getattr(cluster, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{name} is a {type(value).__name__}")
    json.dumps(cluster_to_api(cluster), allow_nan=False)


def regions_to_api() -> dict[str, Any]:
    """``{"regions": [Region]}`` as ``GET /v1/compute/regions`` answers."""
    return {
        "regions": [
            {
                "name": name,
                "supported_instance_types": list(types),
                "driver_versions": [
                    {"id": i, "cuda_version": c, "nvidia_driver_version": d, "os": o}
                    for i, c, d, o in DRIVER_VERSIONS
                ],
            }
            for name, types in REGIONS.items()
        ]
    }


def whoami_to_api(project_id: str) -> dict[str, Any]:
    """A ``project_api_key`` identity (``GET /v3/whoami``)."""
    return {
        "type": "project_api_key",
        "api_key": {"id": "key-tgnb-emulator"},
        "organization": {"id": ORG_ID, "name": ORG_NAME},
        "project": {"id": project_id, "name": "Emulator project", "slug": "emulator"},
    }


def project_to_api(project_id: str) -> dict[str, Any]:
    return {
        "id": project_id,
        "name": "Emulator project" if project_id == DEFAULT_PROJECT_ID else project_id,
        "organization_id": ORG_ID,
        "organization_name": ORG_NAME,
        "slug": project_id,
    }
