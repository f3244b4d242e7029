"""The emulated fleet: standard and preemptible nodes that come and go as the platform's do.

Behaviour (platform durations are multiplied by the one `FleetConfig.time_scale` knob; 0.02 makes
the 300 s drain window last 6 s; timestamps stay on the real clock):

- Standard nodes (``gpu-dp-...``) are provisioned synchronously: they are live as soon as the create
  or update that asks for them returns.
- Raising ``num_preemptible_gpus`` (the target) provisions preemptible nodes (``gpu-preemptible-dp-...``)
  asynchronously, one at a time per cluster, each taking `FleetConfig.provision_delay_s`; a node
  becomes live with a ``TogetherNodeAdded`` event. A capacity cap (global and/or per cluster, in
  GPUs) can keep ``allocated_preemptible_gpus`` below ``desired_preemptible_gpus`` for as long as it
  is set.
- A capacity trace (`tgnb.emulator.trace`: segments in platform time, or drawn from a seed) limits
  preemptible GPUs as the clock advances; when it drops below what is live, the newest preemptible
  nodes are cancelled (provisioning) or preempted (notice, drain window, removal), and when it
  rises the target is provisioned again.
- Lowering the target first cancels nodes still provisioning, then removes running nodes, newest
  first (``TogetherScaledDown``). Draining nodes are left to finish their drain window.
- A preemption (admin endpoint, or a seeded random schedule at `FleetConfig.preemption_rate` per
  node-hour) emits ``TogetherPreemptionNotified`` at T+0 and marks the node draining; at
  T+`drain_window_s` the node is removed (``TogetherPreempted``) and a replacement is provisioned
  toward the target.
- ``allocated_preemptible_gpus`` = 8 x preemptible nodes that are running or draining: the platform
  counts live nodes, and a draining node is live until it is removed.
- Events are de-duplicated by (node, reason) and kept 72 h of platform time; removed nodes are listed
  in ``deleted_gpu_worker_nodes`` for as long.

Time advances for real: a background thread wakes at the next due transition (or every
`FleetConfig.max_tick_s`), so nodes are removed even when nobody asks.

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

import contextlib
import math
import random
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
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
    add_ons_from_body,
    check_record,
    cluster_to_api,
    rfc3339,
)
from tgnb.emulator.nodeview import NOTICE_FILE, REMOVED_FILE, NodeInfo
from tgnb.emulator.store import StateStore
from tgnb.emulator.trace import CapacityTrace, parse
from tgnb.emulator.validation import NOT_FOUND, RequestError
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


def _log(message: str) -> None:
    print(f"tgnb emulator: {message}", file=sys.stderr, flush=True)


def _loaded_cluster(raw: Any) -> FleetCluster | None:
    """A stored cluster record, or None (with a log line) when it cannot be served: a record
    written by an older version, or by hand, never takes the list down."""
    try:
        c = FleetCluster.from_dict(raw)
        check_record(c)
    except Exception as exc:  # any shape of broken record: skipped, the rest is served
        ident = raw.get("cluster_id") if isinstance(raw, dict) else None
        _log(f"skipping stored cluster {str(ident)[:80]!r}: {type(exc).__name__}: {exc}"[:300])
        return None
    return c


class Fleet:
    """All clusters of the emulator, the clock that moves them, and their persistence."""

    def __init__(
        self, config: FleetConfig, store: StateStore, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.clusters: dict[str, FleetCluster] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: GPUs held elsewhere under the same cap (Post-Training resources); read without a lock
        self.external_gpus: Callable[[], int] = lambda: 0
        self.trace: CapacityTrace | None = None
        self._load()

    # ---- persistence -------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            data = self.store.load()
        except ValueError as exc:  # a torn or foreign state.json: kept aside, start empty
            _log(f"{exc}; starting empty")
            return
        if not data:
            return
        raw_clusters = data.get("clusters")
        for raw in raw_clusters if isinstance(raw_clusters, list) else []:
            c = _loaded_cluster(raw)
            if c is not None:
                self.clusters[c.cluster_id] = c
        cap = data.get("capacity_gpus")
        if "capacity_gpus" in data and (
            cap is None or (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0)
        ):
            self.config.capacity_gpus = cap
        if data.get("capacity_trace") is not None:
            self.trace = CapacityTrace.from_dict(data["capacity_trace"])
            if self.trace is None:
                _log("skipping the stored capacity trace: it cannot be read back")

    def _save(self) -> None:
        self.store.save(
            {
                "version": 1,
                "capacity_gpus": self.config.capacity_gpus,
                "capacity_trace": None if self.trace is None else self.trace.to_dict(),
                "clusters": [c.to_dict() for c in self.clusters.values()],
            }
        )

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        with self._lock:
            yield
            self._save()
        self._wake.set()

    # ---- the clock ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background thread that moves time forward."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tgnb-fleet", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                due = self.advance()
            except Exception:  # keep the clock alive; the traceback goes to the emulator's log
                traceback.print_exc()
                due = None
            now = self.clock()
            wait = self.config.max_tick_s if due is None else max(0.0, min(due - now, 0.5))
            self._wake.wait(timeout=max(wait, 0.005))
            self._wake.clear()

    def advance(self) -> float | None:
        """Apply every transition due by now; return when the next one is due (None: none planned)."""
        with self._lock:
            now = self.clock()
            changed = self._apply_trace(now)
            for c in list(self.clusters.values()):
                changed |= self._advance_cluster(c, now)
            if changed:
                self._save()
            return self._next_due()

    def _next_due(self) -> float | None:
        times: list[float] = []
        for c in self.clusters.values():
            for n in c.nodes:
                if n.state == PROVISIONING:
                    times.append(n.ready_at)
                elif n.state == DRAINING and n.deadline is not None:
                    times.append(n.deadline)
                elif n.state == RUNNING and n.preempt_at is not None:
                    times.append(n.preempt_at)
        if self.trace is not None:
            at = self.trace.next_change(self._trace_s(self.clock()))
            if at is not None:
                times.append(self.trace.started_at + self.config.real(at))
        return min(times) if times else None

    def _advance_cluster(self, c: FleetCluster, now: float) -> bool:
        changed = False
        for n in list(c.nodes):
            if n.state == PROVISIONING and n.ready_at <= now:
                self._node_live(c, n, n.ready_at)
                changed = True
            if n.state == RUNNING and n.kind == PREEMPTIBLE:
                if n.preempt_at is None and self.config.preemption_rate > 0:
                    n.preempt_at = self._draw_preemption(c, n)
                    changed = True
                if n.preempt_at is not None and n.preempt_at <= now:
                    self._notify(c, n, n.preempt_at)
                    changed = True
            if n.state == DRAINING and n.deadline is not None and n.deadline <= now:
                self._remove(c, n, n.deadline, PREEMPTED)
                changed = True
        changed |= self._reconcile(c, now)
        changed |= self._prune(c, now)
        return changed

    def _draw_preemption(self, c: FleetCluster, n: FleetNode) -> float:
        # keyed by what a replayed scenario reproduces (not the random cluster id)
        ordinal = n.name.rsplit("-", 1)[-1]
        rng = random.Random(f"{self.config.seed}:{c.cluster_name}:{n.kind}:{ordinal}")
        hours = rng.expovariate(self.config.preemption_rate)
        return n.ready_at + self.config.real(hours * 3600.0)

    # ---- node transitions --------------------------------------------------------------------
    def _event(self, c: FleetCluster, node: str, reason: str, message: str, t: float) -> None:
        if any(e.node == node and e.reason == reason for e in c.events):
            return  # de-duplicated by (node, reason), as the platform does
        c.events.append(LifecycleEvent(node=node, reason=reason, message=message, time=t))

    def _new_node(self, c: FleetCluster, kind: str, now: float) -> FleetNode:
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

    def _node_live(self, c: FleetCluster, n: FleetNode, t: float) -> None:
        n.state = RUNNING
        n.phases.append(("NODE_PHASE_RUNNING", t))
        self.store.node_dir(n.name).mkdir(parents=True, exist_ok=True)
        label = "preemptible" if n.kind == PREEMPTIBLE else "standard"
        self._event(c, n.name, NODE_ADDED, f"{label} node {n.name} joined the cluster", t)

    def _notify(self, c: FleetCluster, n: FleetNode, t: float, why: str = "") -> None:
        window = self.config.real(self.config.drain_window_s)
        n.state, n.notified_at, n.deadline = DRAINING, t, t + window
        self._event(
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

    def _remove(self, c: FleetCluster, n: FleetNode, t: float, reason: str) -> None:
        was_live = n.live
        n.state, n.removed_at, n.removed_reason = REMOVED, t, reason
        n.phases.append(("NODE_PHASE_SUCCEEDED", t))
        if not was_live:  # cancelled while provisioning: it never joined, nothing to report
            c.nodes.remove(n)
            return
        if reason != CLUSTER_DELETED:
            why = "preempted" if reason == PREEMPTED else "removed by a scale-down"
            self._event(c, n.name, reason, f"node {n.name} {why}", t)
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

    def _capacity_left(self, c: FleetCluster) -> float:
        def used(cs: list[FleetCluster]) -> int:
            return GPUS_PER_NODE * sum(len(x.live_nodes(PREEMPTIBLE)) for x in cs)

        left = math.inf
        if self.config.capacity_gpus is not None:
            left = self.config.capacity_gpus - used(list(self.clusters.values()))
            left -= self.external_gpus()
        if c.capacity_gpus is not None:
            left = min(left, c.capacity_gpus - used([c]))
        cap = self._trace_gpus(c, self.clock())
        if cap is not None:
            scope = [c] if self.trace and self.trace.cluster_id else list(self.clusters.values())
            left = min(left, cap - used(scope))
        return left

    # ---- the capacity trace ------------------------------------------------------------------
    def _trace_s(self, now: float) -> float:
        """Platform seconds since the trace started."""
        assert self.trace is not None
        return (now - self.trace.started_at) / self.config.time_scale

    def _trace_gpus(self, c: FleetCluster | None, now: float) -> int | None:
        """The trace's limit on `c` now (None: none; `c` None: the scope the trace covers)."""
        t = self.trace
        if t is None or (c is not None and t.cluster_id not in (None, c.cluster_id)):
            return None
        return t.gpus_at(self._trace_s(now))

    def _apply_trace(self, now: float) -> bool:
        """Bring the preemptible nodes under the trace's limit: cancel the newest provisioning
        ones, then preempt the newest running ones (at the segment's start when it is past)."""
        t = self.trace
        cap = self._trace_gpus(None, now)
        if t is None or cap is None:
            return False
        scope = [self.clusters[t.cluster_id]] if t.cluster_id in self.clusters else []
        if t.cluster_id is None:
            scope = list(self.clusters.values())
        pairs = [(c, n) for c in scope for n in c.live_nodes(PREEMPTIBLE) if n.state != DRAINING]
        over = GPUS_PER_NODE * len(pairs) - cap
        if over <= 0:
            return False
        began = t.started_at + self.config.real(t.segment_start(self._trace_s(now)) or 0.0)
        why = f" (capacity withdrawn: {cap} preemptible GPUs available)"
        pairs.sort(key=lambda cn: (cn[1].state != PROVISIONING, -cn[1].ready_at))
        for c, n in pairs[: math.ceil(over / GPUS_PER_NODE)]:
            if n.state == PROVISIONING:
                self._remove(c, n, now, SCALED_DOWN)
            else:
                self._notify(c, n, min(now, max(began, n.ready_at)), why)
        return True

    def _reconcile(self, c: FleetCluster, now: float) -> bool:
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
                self._remove(c, n, now, SCALED_DOWN)
                changed = True
        elif (
            len(nodes) < want
            and not any(n.state == PROVISIONING for n in nodes)
            and self._capacity_left(c) >= GPUS_PER_NODE
        ):
            self._new_node(c, PREEMPTIBLE, now)
            changed = True
        return changed

    def _prune(self, c: FleetCluster, now: float) -> bool:
        horizon = now - self.config.real(self.config.retention_s)
        before = (len(c.events), len(c.nodes))
        c.events = [e for e in c.events if e.time >= horizon]
        c.nodes = [
            n for n in c.nodes if not (n.state == REMOVED and (n.removed_at or now) < horizon)
        ]
        return before != (len(c.events), len(c.nodes))

    def _set_standard(self, c: FleetCluster, num_gpus: int, now: float) -> None:
        want = num_gpus // GPUS_PER_NODE
        nodes = c.live_nodes(STANDARD)
        for _ in range(want - len(nodes)):
            n = self._new_node(c, STANDARD, now)
            self._node_live(c, n, now)
        for n in sorted(nodes, key=lambda n: n.ready_at, reverse=True)[: max(0, len(nodes) - want)]:
            self._remove(c, n, now, SCALED_DOWN)
        c.num_gpus = num_gpus

    # ---- API operations ----------------------------------------------------------------------
    def _get(self, cluster_id: str) -> FleetCluster:
        c = self.clusters.get(cluster_id)
        if c is None:
            raise RequestError(404, NOT_FOUND, f"cluster {cluster_id[:80]!r} not found")
        return c

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a cluster from a validated create body; standard nodes are live at once."""
        with self._changing():
            now = self.clock()
            c = FleetCluster.from_create(
                body, str(uuid.uuid4()), now, self.config.default_project_id
            )
            self.clusters[c.cluster_id] = c
            self._set_standard(c, body["num_gpus"], now)
            self._reconcile(c, now)
            return cluster_to_api(c)

    def update(self, cluster_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply a validated update; omitted fields keep their value."""
        with self._changing():
            c = self._get(cluster_id)
            now = self.clock()
            self._advance_cluster(c, now)
            if "num_gpus" in body:
                self._set_standard(c, body["num_gpus"], now)
            if "num_preemptible_gpus" in body:
                c.desired_preemptible_gpus = body["num_preemptible_gpus"]
            for name in ("num_reserved_gpus", "num_capacity_pool_gpus", "cluster_type"):
                if name in body:
                    setattr(c, name, body[name])
            for name in ("cluster_config", "reservation_end_time"):
                if name in body:
                    c.extra[name] = body[name]
            if "add_ons" in body:  # the new list replaces the old one, as the API's PUT does
                c.add_ons = add_ons_from_body(body["add_ons"])
            self._reconcile(c, now)
            return cluster_to_api(c)

    def delete(self, cluster_id: str) -> dict[str, Any]:
        with self._changing():
            c = self._get(cluster_id)
            now = self.clock()
            for n in c.live_nodes():
                self._remove(c, n, now, CLUSTER_DELETED)
            del self.clusters[cluster_id]
            return {"cluster_id": cluster_id}

    def retrieve(self, cluster_id: str) -> dict[str, Any]:
        self.advance()
        with self._lock:
            return cluster_to_api(self._get(cluster_id))

    def list_clusters(self, project_id: str | None = None) -> dict[str, Any]:
        self.advance()
        with self._lock:
            cs = [c for c in self.clusters.values() if project_id in (None, c.project_id)]
            out = []
            for c in sorted(cs, key=lambda c: c.created_at):
                try:
                    out.append(cluster_to_api(c))
                except Exception as exc:  # one broken record never takes the list down
                    _log(f"cluster {c.cluster_id[:80]!r} cannot be listed: {exc!r}"[:300])
            return {"clusters": out}

    def capacity_left_for_others(self) -> float:
        """GPUs the global cap leaves after the clusters' live and provisioning preemptible nodes."""
        with self._lock:
            if self.config.capacity_gpus is None:
                return math.inf
            used = sum(len(c.live_nodes(PREEMPTIBLE)) for c in self.clusters.values())
            return float(self.config.capacity_gpus - GPUS_PER_NODE * used)

    def project_ids(self) -> list[str]:
        with self._lock:
            ids = {self.config.default_project_id} | {c.project_id for c in self.clusters.values()}
        return sorted(ids)

    # ---- admin operations --------------------------------------------------------------------
    def preempt(self, cluster_id: str, node: str | None = None) -> dict[str, Any]:
        """Start a preemption now: notice at T+0, removal at T+drain window."""
        self.advance()
        with self._changing():
            c = self._get(cluster_id)
            if node is None:
                candidates = [n for n in c.live_nodes(PREEMPTIBLE) if n.state == RUNNING]
                if not candidates:
                    raise RequestError(409, 9, "no running preemptible node to preempt")
                n = min(candidates, key=lambda n: n.ready_at)
            else:
                found = c.node(node)
                if found is None or found.state == REMOVED:
                    raise RequestError(404, NOT_FOUND, f"node {node!r} not found in {cluster_id}")
                if found.kind != PREEMPTIBLE:
                    raise RequestError(
                        400, 3, f"node {node!r} is standard; only preemptible nodes are preempted"
                    )
                if found.state != RUNNING:
                    raise RequestError(409, 9, f"node {node!r} is {found.state}, not running")
                n = found
            self._notify(c, n, self.clock())
            return self._node_view(c, n)

    def release(self, cluster_id: str, node: str) -> dict[str, Any]:
        """Remove a draining node before its deadline (what was running on it has exited).

        The platform reclaims a node as soon as its pods exit; a local backend calls this when
        every process it ran on `node` is gone. The removal reason stays ``TogetherPreempted``.
        """
        self.advance()
        with self._changing():
            c = self._get(cluster_id)
            n = c.node(node)
            if n is None or n.state == REMOVED:
                raise RequestError(404, NOT_FOUND, f"node {node!r} not found in {cluster_id}")
            if n.state != DRAINING:
                raise RequestError(
                    409, 9, f"node {node!r} is {n.state}; only a draining node is released"
                )
            self._remove(c, n, self.clock(), PREEMPTED)
            self._reconcile(c, self.clock())
            return self._node_view(c, n)

    def set_capacity(self, gpus: int | None, cluster_id: str | None = None) -> dict[str, Any]:
        """Cap preemptible capacity (GPUs, None lifts the cap), for all clusters or one."""
        with self._changing():
            if cluster_id is None:
                self.config.capacity_gpus = gpus
            else:
                self._get(cluster_id).capacity_gpus = gpus
            for c in self.clusters.values():
                self._reconcile(c, self.clock())
            return {"capacity_gpus": gpus, "cluster_id": cluster_id}

    def set_capacity_trace(self, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        """Start the trace `spec` now (`tgnb.emulator.trace.parse`; None ends the trace in force)."""
        trace = None if spec is None else parse(spec)
        self.advance()
        with self._changing():
            if trace is not None and trace.cluster_id is not None:
                self._get(trace.cluster_id)
            self.install_trace(trace)
            return self.capacity_trace()

    def install_trace(self, trace: CapacityTrace | None, keep_same: bool = False) -> None:
        """Make `trace` the one in force, started now (with `keep_same`, the one already in force
        when it is the same document: a restarted daemon goes on where its trace was)."""
        with self._changing():
            if keep_same and trace and self.trace and self.trace.same_as(trace):
                return
            if trace is not None:
                trace.started_at = self.clock()
            self.trace = trace
            self._apply_trace(self.clock())
            for c in self.clusters.values():
                self._reconcile(c, self.clock())

    def capacity_trace(self) -> dict[str, Any] | None:
        """The trace in force (its segments, where the clock is in it), or None."""
        with self._lock:
            t = self.trace
            return None if t is None else t.view(self._trace_s(self.clock()))

    def nodes(self, cluster_id: str) -> list[dict[str, Any]]:
        self.advance()
        with self._lock:
            c = self._get(cluster_id)
            return [self._node_view(c, n) for n in c.nodes]

    def _node_view(self, c: FleetCluster, n: FleetNode) -> dict[str, Any]:
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
