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

Where it lives: `Fleet` (here) holds the clusters, their persistence, the clock and the
operations the HTTP app calls; `tgnb.emulator.lifecycle` moves one cluster's nodes through
their states and writes the node files of the workload plane's contract (its docstring);
`tgnb.emulator.capacity` says what the caps and the capacity trace leave.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from tgnb.emulator.capacity import (
    apply_trace,
    capacity_left,
    preemptible_gpus,
    trace_seconds,
)
from tgnb.emulator.lifecycle import CLUSTER_DELETED, FleetConfig, NodeLifecycle
from tgnb.emulator.models import (
    DRAINING,
    PREEMPTIBLE,
    PROVISIONING,
    REMOVED,
    RUNNING,
    FleetCluster,
    add_ons_from_body,
    check_record,
    cluster_to_api,
)
from tgnb.emulator.store import StateStore
from tgnb.emulator.trace import CapacityTrace, parse
from tgnb.emulator.validation import NOT_FOUND, RequestError
from tgnb.events import PREEMPTED

__all__ = ["CLUSTER_DELETED", "Fleet", "FleetConfig"]


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
        self.lifecycle = NodeLifecycle(config, store, room=self._capacity_left)
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
                changed |= self.lifecycle.advance(c, now)
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
            at = self.trace.next_change(
                trace_seconds(self.trace, self.clock(), self.config.time_scale)
            )
            if at is not None:
                times.append(self.trace.started_at + self.config.real(at))
        return min(times) if times else None

    # ---- capacity ----------------------------------------------------------------------------
    def _capacity_left(self, c: FleetCluster) -> float:
        clusters = list(self.clusters.values())
        return capacity_left(c, clusters, self.config, self.trace, self.external_gpus, self.clock())

    def _apply_trace(self, now: float) -> bool:
        return apply_trace(self.trace, self.clusters, now, self.config, self.lifecycle)

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
            self.lifecycle.set_standard(c, body["num_gpus"], now)
            self.lifecycle.reconcile(c, now)
            return cluster_to_api(c)

    def update(self, cluster_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply a validated update; omitted fields keep their value."""
        with self._changing():
            c = self._get(cluster_id)
            now = self.clock()
            self.lifecycle.advance(c, now)
            if "num_gpus" in body:
                self.lifecycle.set_standard(c, body["num_gpus"], now)
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
            self.lifecycle.reconcile(c, now)
            return cluster_to_api(c)

    def delete(self, cluster_id: str) -> dict[str, Any]:
        with self._changing():
            c = self._get(cluster_id)
            now = self.clock()
            for n in c.live_nodes():
                self.lifecycle.remove(c, n, now, CLUSTER_DELETED)
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
            return float(self.config.capacity_gpus - preemptible_gpus(self.clusters.values()))

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
            self.lifecycle.notify(c, n, self.clock())
            return self.lifecycle.view(c, n)

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
            self.lifecycle.remove(c, n, self.clock(), PREEMPTED)
            self.lifecycle.reconcile(c, self.clock())
            return self.lifecycle.view(c, n)

    def set_capacity(self, gpus: int | None, cluster_id: str | None = None) -> dict[str, Any]:
        """Cap preemptible capacity (GPUs, None lifts the cap), for all clusters or one."""
        with self._changing():
            if cluster_id is None:
                self.config.capacity_gpus = gpus
            else:
                self._get(cluster_id).capacity_gpus = gpus
            for c in self.clusters.values():
                self.lifecycle.reconcile(c, self.clock())
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
                self.lifecycle.reconcile(c, self.clock())

    def capacity_trace(self) -> dict[str, Any] | None:
        """The trace in force (its segments, where the clock is in it), or None."""
        with self._lock:
            t = self.trace
            return (
                None
                if t is None
                else t.view(trace_seconds(t, self.clock(), self.config.time_scale))
            )

    def nodes(self, cluster_id: str) -> list[dict[str, Any]]:
        self.advance()
        with self._lock:
            c = self._get(cluster_id)
            return [self.lifecycle.view(c, n) for n in c.nodes]
