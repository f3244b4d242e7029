"""How much preemptible capacity the fleet has left: the caps and the capacity trace in force.

Three limits, in GPUs, each on live and provisioning preemptible nodes: the global cap
(`FleetConfig.capacity_gpus`, shared with what else holds GPUs under it, the Post-Training
resources), a cluster's own cap (``FleetCluster.capacity_gpus``), and the capacity trace
(`tgnb.emulator.trace`, for one cluster or all of them) at the point its clock has reached.
`capacity_left` is what `NodeLifecycle` may still provision; `apply_trace` brings the nodes back
under a trace that dropped. Plain functions over the cluster records: `tgnb.emulator.fleet` owns
the records, the trace and the lock, and calls them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from tgnb.emulator.lifecycle import FleetConfig, NodeLifecycle
from tgnb.emulator.models import DRAINING, GPUS_PER_NODE, PREEMPTIBLE, PROVISIONING, FleetCluster
from tgnb.emulator.trace import CapacityTrace
from tgnb.events import SCALED_DOWN


def preemptible_gpus(clusters: Iterable[FleetCluster]) -> int:
    """GPUs of the live and provisioning preemptible nodes of `clusters`."""
    return GPUS_PER_NODE * sum(len(c.live_nodes(PREEMPTIBLE)) for c in clusters)


def trace_seconds(trace: CapacityTrace, now: float, time_scale: float) -> float:
    """Platform seconds since `trace` started."""
    return (now - trace.started_at) / time_scale


def trace_limit(
    trace: CapacityTrace | None, c: FleetCluster | None, now: float, time_scale: float
) -> int | None:
    """The trace's limit on `c` now (None: none; `c` None: the scope the trace covers)."""
    if trace is None or (c is not None and trace.cluster_id not in (None, c.cluster_id)):
        return None
    return trace.gpus_at(trace_seconds(trace, now, time_scale))


def capacity_left(
    c: FleetCluster,
    clusters: list[FleetCluster],
    config: FleetConfig,
    trace: CapacityTrace | None,
    external_gpus: Callable[[], int],
    now: float,
) -> float:
    """The preemptible GPUs `c` may still add under every limit (`clusters`: all of them;
    `external_gpus`: what else holds GPUs under the global cap)."""
    left = math.inf
    if config.capacity_gpus is not None:
        left = config.capacity_gpus - preemptible_gpus(clusters)
        left -= external_gpus()
    if c.capacity_gpus is not None:
        left = min(left, c.capacity_gpus - preemptible_gpus([c]))
    cap = trace_limit(trace, c, now, config.time_scale)
    if cap is not None:
        scope = [c] if trace and trace.cluster_id else clusters
        left = min(left, cap - preemptible_gpus(scope))
    return left


def apply_trace(
    trace: CapacityTrace | None,
    clusters: dict[str, FleetCluster],
    now: float,
    config: FleetConfig,
    lifecycle: NodeLifecycle,
) -> bool:
    """Bring the preemptible nodes under the trace's limit: cancel the newest provisioning
    ones, then preempt the newest running ones (at the segment's start when it is past)."""
    t = trace
    cap = trace_limit(t, None, now, config.time_scale)
    if t is None or cap is None:
        return False
    scope = [clusters[t.cluster_id]] if t.cluster_id in clusters else []
    if t.cluster_id is None:
        scope = list(clusters.values())
    pairs = [(c, n) for c in scope for n in c.live_nodes(PREEMPTIBLE) if n.state != DRAINING]
    over = GPUS_PER_NODE * len(pairs) - cap
    if over <= 0:
        return False
    began = t.started_at + config.real(
        t.segment_start(trace_seconds(t, now, config.time_scale)) or 0.0
    )
    why = f" (capacity withdrawn: {cap} preemptible GPUs available)"
    pairs.sort(key=lambda cn: (cn[1].state != PROVISIONING, -cn[1].ready_at))
    for c, n in pairs[: math.ceil(over / GPUS_PER_NODE)]:
        if n.state == PROVISIONING:
            lifecycle.remove(c, n, now, SCALED_DOWN)
        else:
            lifecycle.notify(c, n, min(now, max(began, n.ready_at)), why)
    return True
