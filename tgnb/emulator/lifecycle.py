"""The life of one cluster's nodes: provisioning, joining, preemption notice, drain, removal.

`NodeLifecycle` moves the nodes of a `FleetCluster` record through their states by the
`FleetConfig` knobs (durations in platform seconds, multiplied by `FleetConfig.time_scale`), records
their lifecycle events and writes their files; `tgnb.emulator.fleet` holds the clusters and calls it
under its lock, and says how much preemptible capacity is left (`tgnb.emulator.capacity`).

File contract for the workload plane (a local backend running processes "on" these nodes):

- every node has a directory ``<state_dir>/nodes/<node_name>/`` (created when the node becomes live;
  ``GET /_emulator/clusters/{id}/nodes`` gives each node's ``dir``);
- at preemption T+0 the emulator writes ``preemption-notice.json`` there, atomically:
  ``{"node", "cluster_id", "reason": "TogetherPreemptionNotified", "notified_at", "deadline"}``
  (RFC 3339 UTC strings) plus ``deadline_unix`` (POSIX seconds) and ``window_s`` (real seconds);
- when the node is removed it writes ``removed.json``:
  ``{"node", "cluster_id", "reason" (TogetherPreempted | TogetherScaledDown | ClusterDeleted),
  "removed_at", "removed_unix"}``.
A backend should kill what still runs on a node once ``removed.json`` appears.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tgnb.emulator.models import (
    DEFAULT_PROJECT_ID,
    DRAINING,
    GPUS_PER_NODE,
    PREEMPTIBLE,
    PROVISIONING,
    REMOVED,
    RUNNING,
    STANDARD,
    FleetCluster,
    FleetNode,
    LifecycleEvent,
    rfc3339,
)
from tgnb.emulator.nodeview import NOTICE_FILE, REMOVED_FILE, NodeInfo
from tgnb.emulator.store import StateStore
from tgnb.events import NODE_ADDED, PREEMPTED, PREEMPTION_NOTIFIED, SCALED_DOWN

CLUSTER_DELETED = "ClusterDeleted"  # removed.json reason when the whole cluster goes


@dataclass
class FleetConfig:
    """The fleet's knobs. Durations are platform seconds; `time_scale` multiplies every one."""

    time_scale: float = 1.0
    drain_window_s: float = 300.0
    provision_delay_s: float = 60.0
    preemption_rate: float = 0.0  # random preemptions per preemptible node-hour (platform time)
    seed: int = 0
    capacity_gpus: int | None = None  # global cap on live + provisioning preemptible GPUs
    retention_s: float = 72 * 3600.0
    default_project_id: str = DEFAULT_PROJECT_ID
    max_tick_s: float = 0.5

    def real(self, platform_seconds: float) -> float:
        return platform_seconds * self.time_scale


class NodeLifecycle:
    """The node transitions of cluster records, by `config`, with the node files in `store`.

    `room` says how many preemptible GPUs a cluster may still add (caps, trace, other users of the
    capacity): a replacement or a raised target is provisioned only when a node's worth is left.
    The caller holds the clusters' lock and persists the records.
    """

    def __init__(
        self, config: FleetConfig, store: StateStore, room: Callable[[FleetCluster], float]
    ) -> None:
        self.config = config
        self.store = store
        self.room = room

    def advance(self, c: FleetCluster, now: float) -> bool:
        """Apply the transitions of `c` due by `now`, move it toward its target, prune what
        expired; whether anything changed."""
        changed = False
        for n in list(c.nodes):
            if n.state == PROVISIONING and n.ready_at <= now:
                self.node_live(c, n, n.ready_at)
                changed = True
            if n.state == RUNNING and n.kind == PREEMPTIBLE:
                if n.preempt_at is None and self.config.preemption_rate > 0:
                    n.preempt_at = self.draw_preemption(c, n)
                    changed = True
                if n.preempt_at is not None and n.preempt_at <= now:
                    self.notify(c, n, n.preempt_at)
                    changed = True
            if n.state == DRAINING and n.deadline is not None and n.deadline <= now:
                self.remove(c, n, n.deadline, PREEMPTED)
                changed = True
        changed |= self.reconcile(c, now)
        changed |= self.prune(c, now)
        return changed

    def draw_preemption(self, c: FleetCluster, n: FleetNode) -> float:
        # keyed by what a replayed scenario reproduces (not the random cluster id)
        ordinal = n.name.rsplit("-", 1)[-1]
        rng = random.Random(f"{self.config.seed}:{c.cluster_name}:{n.kind}:{ordinal}")
        hours = rng.expovariate(self.config.preemption_rate)
        return n.ready_at + self.config.real(hours * 3600.0)

    def event(self, c: FleetCluster, node: str, reason: str, message: str, t: float) -> None:
        if any(e.node == node and e.reason == reason for e in c.events):
            return  # de-duplicated by (node, reason), as the platform does
        c.events.append(LifecycleEvent(node=node, reason=reason, message=message, time=t))

    def new_node(self, c: FleetCluster, kind: str, now: float) -> FleetNode:
        delay = 0.0 if kind == STANDARD else self.config.real(self.config.provision_delay_s)
        n = FleetNode(
            name=c.next_name(kind),
            kind=kind,
            state=PROVISIONING,
            requested_at=now,
            ready_at=now + delay,
            phases=[("NODE_PHASE_PENDING", now), ("NODE_PHASE_BOOTING", now)],
        )
        c.nodes.append(n)
        return n

    def node_live(self, c: FleetCluster, n: FleetNode, t: float) -> None:
        n.state = RUNNING
        n.phases.append(("NODE_PHASE_RUNNING", t))
        self.store.node_dir(n.name).mkdir(parents=True, exist_ok=True)
        label = "preemptible" if n.kind == PREEMPTIBLE else "standard"
        self.event(c, n.name, NODE_ADDED, f"{label} node {n.name} joined the cluster", t)

    def notify(self, c: FleetCluster, n: FleetNode, t: float, why: str = "") -> None:
        window = self.config.real(self.config.drain_window_s)
        n.state, n.notified_at, n.deadline = DRAINING, t, t + window
        self.event(
            c,
            n.name,
            PREEMPTION_NOTIFIED,
            f"node {n.name} will be preempted{why}; drain window ends at {rfc3339(n.deadline)}",
            t,
        )
        self.store.write_node_file(
            n.name,
            NOTICE_FILE,
            {
                "node": n.name,
                "cluster_id": c.cluster_id,
                "reason": PREEMPTION_NOTIFIED,
                "notified_at": rfc3339(t),
                "deadline": rfc3339(n.deadline),
                "deadline_unix": n.deadline,
                "window_s": window,
            },
        )

    def remove(self, c: FleetCluster, n: FleetNode, t: float, reason: str) -> None:
        was_live = n.live
        n.state, n.removed_at, n.removed_reason = REMOVED, t, reason
        n.phases.append(("NODE_PHASE_SUCCEEDED", t))
        if not was_live:  # cancelled while provisioning: it never joined, nothing to report
            c.nodes.remove(n)
            return
        if reason != CLUSTER_DELETED:
            why = "preempted" if reason == PREEMPTED else "removed by a scale-down"
            self.event(c, n.name, reason, f"node {n.name} {why}", t)
        self.store.write_node_file(
            n.name,
            REMOVED_FILE,
            {
                "node": n.name,
                "cluster_id": c.cluster_id,
                "reason": reason,
                "removed_at": rfc3339(t),
                "removed_unix": t,
            },
        )

    def reconcile(self, c: FleetCluster, now: float) -> bool:
        """Move the preemptible node count toward the target."""
        want = c.desired_preemptible_gpus // GPUS_PER_NODE
        nodes = c.live_nodes(PREEMPTIBLE)
        changed = False
        if len(nodes) > want:
            excess = len(nodes) - want
            provisioning = [n for n in nodes if n.state == PROVISIONING]
            running = sorted(
                (n for n in nodes if n.state == RUNNING), key=lambda n: n.ready_at, reverse=True
            )
            for n in (provisioning + running)[:excess]:
                self.remove(c, n, now, SCALED_DOWN)
                changed = True
        elif (
            len(nodes) < want
            and not any(n.state == PROVISIONING for n in nodes)
            and self.room(c) >= GPUS_PER_NODE
        ):
            self.new_node(c, PREEMPTIBLE, now)
            changed = True
        return changed

    def prune(self, c: FleetCluster, now: float) -> bool:
        horizon = now - self.config.real(self.config.retention_s)
        before = (len(c.events), len(c.nodes))
        c.events = [e for e in c.events if e.time >= horizon]
        c.nodes = [
            n for n in c.nodes if not (n.state == REMOVED and (n.removed_at or now) < horizon)
        ]
        return before != (len(c.events), len(c.nodes))

    def set_standard(self, c: FleetCluster, num_gpus: int, now: float) -> None:
        want = num_gpus // GPUS_PER_NODE
        nodes = c.live_nodes(STANDARD)
        for _ in range(want - len(nodes)):
            n = self.new_node(c, STANDARD, now)
            self.node_live(c, n, now)
        for n in sorted(nodes, key=lambda n: n.ready_at, reverse=True)[: max(0, len(nodes) - want)]:
            self.remove(c, n, now, SCALED_DOWN)
        c.num_gpus = num_gpus

    def view(self, c: FleetCluster, n: FleetNode) -> dict[str, Any]:
        """Node `n` of `c` as the admin routes list it (`NodeInfo`, with its directory)."""
        return NodeInfo(
            name=n.name,
            cluster_id=c.cluster_id,
            kind=n.kind,
            state=n.state,
            gpus=GPUS_PER_NODE,
            directory=str(self.store.node_dir(n.name)),
            deadline=n.deadline,
            requested_at=n.requested_at,
            ready_at=n.ready_at,
            notified_at=n.notified_at,
            removed_at=n.removed_at,
            removed_reason=n.removed_reason,
        ).to_wire()
