"""Snapshots of a cluster as the clusters API reports it: `ClusterState` and its `NodeState` s.

A snapshot holds no secret: the API's ``kube_config`` is never copied into it, so its text and HTML
reprs are safe to show in a notebook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tgnb.events import Event, dedupe, format_time, parse_time, utcnow
from tgnb.markup import escape, plain
from tgnb.prices import PREEMPTIBLE_PREFIX, Prices, resolve


def _short_phase(phase: str) -> str:
    for prefix in ("NODE_PHASE_", "CLUSTER_PHASE_"):
        if phase.startswith(prefix):
            return phase[len(prefix) :]
    return phase


def _phases(items: Sequence[Mapping[str, Any]] | None) -> tuple[tuple[str, datetime], ...]:
    out = []
    for item in items or ():
        if item.get("phase") and item.get("transition_time"):
            out.append((str(item["phase"]), parse_time(item["transition_time"])))
    return tuple(sorted(out, key=lambda p: p[1]))


@dataclass(frozen=True)
class NodeState:
    """One GPU worker node: its name, GPUs, status and phase history (oldest first)."""

    name: str
    gpus: int
    status: str
    preemptible: bool
    node_id: str = ""
    phases: tuple[tuple[str, datetime], ...] = ()

    @property
    def phase(self) -> str | None:
        """The latest phase, without the ``NODE_PHASE_`` prefix (e.g. ``RUNNING``)."""
        return _short_phase(self.phases[-1][0]) if self.phases else None

    @property
    def phase_since(self) -> datetime | None:
        return self.phases[-1][1] if self.phases else None

    @property
    def kind(self) -> str:
        return "preemptible" if self.preemptible else "standard"

    @classmethod
    def from_api(cls, record: Mapping[str, Any]) -> NodeState:
        host = str(record.get("host_name") or "")
        node_id = str(record.get("node_id") or "")
        name = host or node_id
        return cls(
            name=name,
            gpus=int(record.get("num_gpus") or 0),
            status=str(record.get("status") or ""),
            preemptible=any(n.startswith(PREEMPTIBLE_PREFIX) for n in (host, node_id)),
            node_id=node_id,
            phases=_phases(record.get("phase_transitions")),
        )


def _as_mapping(cluster: Any) -> Mapping[str, Any]:
    if isinstance(cluster, Mapping):
        return cluster
    dump = getattr(cluster, "model_dump", None)
    if dump is None:
        raise TypeError(f"not a cluster: {type(cluster).__name__}")
    result: Mapping[str, Any] = dump(mode="json")
    return result


@dataclass(frozen=True)
class ClusterState:
    """A cluster at one moment: the preemptible target (desired) against what is allocated.

    `num_gpus` counts standard GPUs; `desired_preemptible_gpus` echoes the target;
    `allocated_preemptible_gpus` is what is live now and can stay below the target when capacity
    is short. `events` are the cluster's ``node_lifecycle_events``, de-duplicated, oldest first.
    """

    id: str
    name: str
    type: str
    status: str
    region: str = ""
    gpu_type: str = ""
    num_gpus: int = 0
    desired_preemptible_gpus: int = 0
    allocated_preemptible_gpus: int = 0
    project_id: str = ""
    standard_nodes: tuple[NodeState, ...] = ()
    preemptible_nodes: tuple[NodeState, ...] = ()
    phases: tuple[tuple[str, datetime], ...] = ()
    events: tuple[Event, ...] = ()
    #: the API's ``pricing`` object where it gives one (the emulator does; see `tgnb.prices`)
    pricing: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    fetched_at: datetime = field(default_factory=utcnow, compare=False)

    @classmethod
    def from_api(cls, cluster: Any) -> ClusterState:
        """Build from an SDK ``Cluster`` (or its JSON dict). ``kube_config`` is left out."""
        c = _as_mapping(cluster)
        nodes = [NodeState.from_api(n) for n in c.get("gpu_worker_nodes") or ()]
        lifecycle = []
        for rec in c.get("node_lifecycle_events") or ():
            try:
                lifecycle.append(Event.from_lifecycle(rec))
            except (KeyError, ValueError, TypeError):
                continue  # a malformed record is skipped, not fatal to a status read
        return cls(
            id=str(c.get("cluster_id") or ""),
            name=str(c.get("cluster_name") or ""),
            type=str(c.get("cluster_type") or ""),
            status=str(c.get("status") or ""),
            region=str(c.get("region") or ""),
            gpu_type=str(c.get("gpu_type") or ""),
            num_gpus=int(c.get("num_gpus") or 0),
            desired_preemptible_gpus=int(c.get("desired_preemptible_gpus") or 0),
            allocated_preemptible_gpus=int(c.get("allocated_preemptible_gpus") or 0),
            project_id=str(c.get("project_id") or ""),
            standard_nodes=tuple(n for n in nodes if not n.preemptible),
            preemptible_nodes=tuple(n for n in nodes if n.preemptible),
            phases=_phases(c.get("phase_transitions")),
            events=tuple(dedupe(lifecycle)),
            pricing=c.get("pricing") if isinstance(c.get("pricing"), Mapping) else None,
        )

    def prices(
        self, standard: float | None = None, preemptible: float | None = None
    ) -> Prices | None:
        """USD per GPU-hour of this cluster's node classes (`tgnb.prices.resolve`: the
        overrides, else the API's pricing, else the published rates of its GPU type)."""
        return resolve(self.gpu_type, self.pricing, standard, preemptible)

    @property
    def nodes(self) -> tuple[NodeState, ...]:
        return self.standard_nodes + self.preemptible_nodes

    @property
    def phase(self) -> str | None:
        """The latest cluster phase, without the ``CLUSTER_PHASE_`` prefix (e.g. ``READY``)."""
        return _short_phase(self.phases[-1][0]) if self.phases else None

    @property
    def capacity_reached(self) -> bool:
        """Whether allocated preemptible GPUs have reached the target."""
        return self.allocated_preemptible_gpus >= self.desired_preemptible_gpus

    def _header(self) -> list[str]:
        return [
            f"cluster {self.name} ({self.id})  {self.type}  {self.status}  "
            f"{self.gpu_type} in {self.region}",
            f"standard GPUs {self.num_gpus}  preemptible: target {self.desired_preemptible_gpus}, "
            f"allocated {self.allocated_preemptible_gpus}",
        ]

    def _rows(self) -> list[tuple[str, str, str, str, str, str]]:
        rows = []
        for n in self.nodes:
            since = format_time(n.phase_since) if n.phase_since else ""
            rows.append((n.name, n.kind, str(n.gpus), n.status, n.phase or "", since))
        return rows

    def __str__(self) -> str:
        lines = self._header()
        head = ("NODE", "KIND", "GPUS", "STATUS", "PHASE", "SINCE")
        rows = self._rows()
        if rows:
            widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
            for r in [head, *rows]:
                lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        else:
            lines.append("(no GPU worker nodes)")
        return plain("\n".join(lines))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = escape
        header = "<br>".join(e(line) for line in self._header())
        cells = "".join(
            "<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in self._rows()
        )
        head = "".join(
            f"<th>{h}</th>" for h in ("node", "kind", "GPUs", "status", "phase", "since")
        )
        return (
            f'<div class="tgnb-cluster"><div>{header}</div>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table></div>"
        )
