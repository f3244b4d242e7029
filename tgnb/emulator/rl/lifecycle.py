"""Model resources and training sessions: provisioning, capacity, expiry, restart, GPU-minutes.

Resources. A create answers ``PENDING``; while the GPU capacity cap (the one the clusters'
preemptible nodes count against, `tgnb.emulator.fleet`) leaves too few GPUs, it stays PENDING
with ``status_details.queue_position`` (1 = next). Once granted it is ``CREATING`` for the
provisioning delay (``provision_delay_s`` x ``time_scale``) while the engine loads the base model
on a thread, then ``READY``. A resource holds 1 + ``num_generator_replicas`` GPUs from CREATING
until STOPPED. It stops itself (sessions ``EXPIRED``) after ``inactive_timeout``
seconds (real, see below) without an operation (never while one runs); ``extend-expiry`` pushes that later. Stop is
refused (400) while sessions are active unless ``force``; it answers ``STOPPED`` at once. A
create's ``Idempotency-Key`` (tgnb sends one) names its resource: the same key again answers that
resource, as an operation's does.
GPU-seconds count from READY to STOPPED, in platform seconds (real seconds / ``time_scale``).

The time scale compresses the platform, never the user: provisioning and queueing are scaled, but
``inactive_timeout`` and ``extend-expiry`` are the user's idle time, in REAL seconds at any time
scale (left idle less than its timeout, it is still there; a test sets `RLConfig.idle_scale` below
1 to wait less). Billing stays in platform seconds (the usage report says so: ``clock:
"platform"`` with its ``time_scale``), so an idle hour at time scale 0.02 bills 50 platform hours.

Sessions. Up to `RLConfig.max_lora_sessions` (5) active sessions on a LoRA resource, 1 on a
full-weight one; over that a create answers 429 with ``retry-after-ms``. A session's operations run
on its FIFO (`tgnb.emulator.rl.operations`); opening the adapter (and loading
``resume_from_checkpoint_id``) is the first job on it.

After a daemon restart (the trainer state lived in memory). Records, checkpoints and operations are
on disk; each resource that held GPUs loads its base model again (it was never stopped; its
inactivity count restarts). Its GPU time billed before the crash is kept as it was, in platform
seconds at the time scale it ran under (``billed_s``); the downtime, from the daemon's last
heartbeat (``rl/heartbeat``, touched every `HEARTBEAT_S`) to the restart, is NOT billed and the
usage report says how long it was (``unbilled_downtime_s``, real seconds); billing goes on from the
restart at the new daemon's time scale. A session that was active resumes from its newest training
checkpoint (weights, optimizer and step as saved then; operations after it are lost) and says so:
``metadata.emulator_restart`` (a sentence) and ``metadata.emulator_rollbacks`` (a list of
``{at, checkpoint, from_step, to_step}``: the step it had reached, as last saved, and the
checkpoint's), and the session is RUNNING again at the checkpoint's step. A session with no training checkpoint goes to ``ERROR`` with
``TRAINING_SESSION_ERROR_CODE_SESSION_FAILED`` and a message to start a new session (from a
checkpoint when there is one). Nothing is silently reset. Operations cut short are FAILED.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tgnb.emulator.rl import views
from tgnb.emulator.rl.operations import Operations
from tgnb.emulator.rl.state import (
    R_CREATING,
    R_ERROR,
    R_HOLDS_GPUS,
    R_PENDING,
    R_READY,
    R_STOPPED,
    R_STOPPING,
    S_ACTIVE,
    S_CREATING,
    S_ERROR,
    S_EXPIRED,
    S_RUNNING,
    S_STOPPED,
    SESSION_FAILED,
    CheckpointRecord,
    ResourceRecord,
    RLStore,
    SessionRecord,
)
from tgnb.emulator.validation import NOT_FOUND, RequestError

RESOURCE_EXHAUSTED = 8
HOST_LOAD_TIMEOUT_S = 600.0
HEARTBEAT_S = 1.0
#: Session metadata: every rollback to a training checkpoint a daemon restart made.
ROLLBACKS = "emulator_rollbacks"


@dataclass
class RLConfig:
    """The Post-Training side's knobs (platform durations are scaled by `time_scale`)."""

    time_scale: float = 1.0
    provision_delay_s: float = 60.0
    price_per_gpu_hour: float = 9.0
    max_lora_sessions: int = 5
    project_id: str = "proj_emulator"
    extra_models: tuple[str, ...] = ()
    device: str | None = None
    retry_after_ms: int = 2000
    tick_s: float = 0.2
    idle_scale: float = 1.0  # real seconds per second of the user's idle time (tests: below 1)

    def real(self, platform_seconds: float) -> float:
        return platform_seconds * self.time_scale


class Platform:
    """Every resource, session and checkpoint of the emulator, their engines and their clock."""

    def __init__(
        self,
        config: RLConfig,
        store: RLStore,
        capacity_left: Callable[[], float] = lambda: math.inf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.capacity_left = capacity_left  # GPUs the clusters leave under the shared cap
        self.clock = clock
        self.lock = threading.RLock()
        self.resources, self.sessions, self.checkpoints, ops = store.load()
        self.ops = Operations(store, self._touch_session)
        self.ops.restore(ops, clock())
        self.hosts: dict[str, Any] = {}
        self._loaded: dict[str, threading.Event] = {}
        self.held_gpus = 0  # read without the lock by the fleet
        self.dirty = False  # a session's step/policy state changed since the last save
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat = 0.0
        self._recover()

    # ---- persistence and clock ---------------------------------------------------------------
    def save(self, durable: bool = True) -> None:
        with self.lock:
            self.dirty = False
            self.held_gpus = sum(
                r.gpus for r in self.resources.values() if r.status in R_HOLDS_GPUS
            )
            self.store.save(self.resources, self.sessions, self.checkpoints, durable=durable)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tgnb-rl", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.ops.shutdown()
        if self.dirty:
            self.save()

    def _run(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            try:
                self.tick()
            except Exception:  # keep the clock alive; the traceback goes to the log
                traceback.print_exc()

    def tick(self) -> None:
        """Grant queued resources, finish provisioning, expire idle resources."""
        left = self.capacity_left()  # outside our lock: the fleet takes its own
        now = self.clock()
        changed = False
        if now - self._beat >= HEARTBEAT_S:
            self._beat = now
            with contextlib.suppress(OSError):
                self.store.beat()
        with self.lock:
            left -= self.held_gpus
            for r in sorted(self.resources.values(), key=lambda r: r.created_at):
                if r.status == R_PENDING:
                    if r.gpus > left:
                        break  # first in, first out: nobody overtakes the head of the queue
                    left -= r.gpus
                    r.status, r.creating_at, r.updated_at = R_CREATING, now, now
                    r.ready_due = now + self.config.real(self.config.provision_delay_s)
                    self._load_host(r)
                    changed = True
            for r in self.resources.values():
                if r.status == R_CREATING and r.id in self._loaded:
                    if self._loaded[r.id].is_set() and now >= (r.ready_due or now):
                        if r.id in self.hosts:
                            r.status, r.ready_at, r.last_activity = R_READY, now, now
                            r.billing_since, r.billing_scale = now, self.config.time_scale
                        else:
                            r.status, r.stopped_at = R_ERROR, now
                            r.error = {
                                "code": "MODEL_RESOURCES_ERROR_CODE_PROVISIONING_FAILED",
                                "message": "the emulator could not load the base model; "
                                "see the emulator's log",
                                "occurred_at": views.ts(now),
                            }
                        r.updated_at = now
                        changed = True
                elif r.status == R_READY and now >= self.expires_at(r):
                    busy = self.ops.busy_sessions()
                    if not any(
                        s.resource_id == r.id and s.id in busy for s in self.sessions.values()
                    ):
                        self._stop_resource(r, now, S_EXPIRED)
                        changed = True
            if changed:
                self.save()
            elif self.dirty:
                self.save(durable=False)

    def expires_at(self, r: ResourceRecord) -> float:
        """The user's idle time: REAL seconds at any time scale (see the module docstring)."""
        idle_since = r.last_activity or r.ready_at or r.created_at
        idle = idle_since + r.inactive_timeout * self.config.idle_scale
        return max(idle, r.extended_until or 0.0)

    def queue_position(self, r: ResourceRecord) -> int | None:
        if r.status != R_PENDING:
            return None
        ahead = [
            x
            for x in self.resources.values()
            if x.status == R_PENDING and x.created_at < r.created_at
        ]
        return len(ahead) + 1

    # ---- engines -----------------------------------------------------------------------------
    def _load_host(self, r: ResourceRecord) -> None:
        event = self._loaded[r.id] = threading.Event()

        def load() -> None:
            try:
                from tgnb.emulator.rl.catalog import resolve
                from tgnb.emulator.rl.engine import ResourceHost

                spec = resolve(r.base_model, self.config.extra_models)
                host = ResourceHost(spec, lora_enabled=r.lora_enabled, device=self.config.device)
                with self.lock:
                    if r.status in R_HOLDS_GPUS:
                        self.hosts[r.id] = host
            except Exception:
                traceback.print_exc()
            finally:
                event.set()

        threading.Thread(target=load, name=f"tgnb-rl-load-{r.id[:8]}", daemon=True).start()

    def host_for(self, resource_id: str) -> Any:
        """The resource's engine, waiting for it to load (a worker thread only)."""
        event = self._loaded.get(resource_id)
        if event is not None:
            event.wait(HOST_LOAD_TIMEOUT_S)
        host = self.hosts.get(resource_id)
        if host is None:
            raise RuntimeError(f"model resource {resource_id} has no loaded model")
        return host

    def wait_ready(self, resource_id: str, timeout: float) -> None:
        """Block (a thread, never the event loop) until the resource leaves PENDING/CREATING."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            with self.lock:
                r = self.resources.get(resource_id)
                if r is None or r.status not in (R_PENDING, R_CREATING):
                    return
                if r.status == R_PENDING:
                    return  # queued: say so now (queue_position), do not hold the request
                due = r.ready_due or 0.0
            if due - self.clock() > deadline - time.monotonic():
                return
            time.sleep(0.02)

    # ---- resources ---------------------------------------------------------------------------
    def resource(self, resource_id: str) -> ResourceRecord:
        r = self.resources.get(resource_id)
        if r is None or r.project_id != self.config.project_id:
            raise RequestError(404, NOT_FOUND, f"model resource {resource_id!r} not found")
        return r

    def create_resource(self, checked: dict[str, Any], key: str | None = None) -> ResourceRecord:
        """A new resource; with an Idempotency-Key already used for one, that one (a retry after
        a lost answer creates nothing), or a 422 if the key came with another body."""
        now = self.clock()
        with self.lock:
            for old in self.resources.values() if key else ():
                if old.idempotency_key == key and old.project_id == self.config.project_id:
                    if any(getattr(old, k) != v for k, v in checked.items()):
                        raise RequestError(
                            422,
                            3,
                            f"Idempotency-Key {key!r} already created model resource {old.id} "
                            "with another body: send a new key for a new resource",
                        )
                    return old
            r = ResourceRecord(
                id=str(uuid.uuid4()),
                project_id=self.config.project_id,
                created_at=now,
                updated_at=now,
                idempotency_key=key,
                **checked,
            )
            self.resources[r.id] = r
            self.save()
        self.tick()
        return r

    def active_sessions(self, resource_id: str) -> list[SessionRecord]:
        return [
            s
            for s in self.sessions.values()
            if s.resource_id == resource_id and s.status in S_ACTIVE
        ]

    def stop_resource(self, resource_id: str, force: bool) -> ResourceRecord:
        with self.lock:
            r = self.resource(resource_id)
            if r.status in (R_STOPPED, R_ERROR):
                return r
            active = self.active_sessions(r.id)
            if active and not force:
                ids = ", ".join(s.id for s in active)
                raise RequestError(
                    400,
                    3,
                    f"model resource {r.id} has {len(active)} active training session(s) "
                    f"({ids}): stop them first, or stop the resource with force=true",
                )
            self._stop_resource(r, self.clock(), S_STOPPED)
            self.save()
            return r

    def _stop_resource(self, r: ResourceRecord, now: float, session_status: str) -> None:
        for s in self.active_sessions(r.id):
            self._end_session(s, now, session_status)
        r.status, r.updated_at = R_STOPPED, now
        if r.ready_at is not None or r.creating_at is not None:
            r.stopped_at = now
        self.hosts.pop(r.id, None)
        self._loaded.pop(r.id, None)

    def extend_expiry(self, resource_id: str, seconds: int) -> ResourceRecord:
        with self.lock:
            r = self.resource(resource_id)
            if r.status != R_READY:
                raise RequestError(
                    400, 3, f"model resource {r.id} is {r.status}; extend-expiry needs READY"
                )
            now = self.clock()
            r.extended_until = max(r.extended_until or 0.0, now + seconds * self.config.idle_scale)
            r.updated_at = now
            self.save()
            return r

    def usage(self, resource_id: str) -> dict[str, Any]:
        """GPU-seconds (platform time) from READY to STOPPED (or now), their price, the times
        (`views.usage`)."""
        with self.lock:
            r = self.resource(resource_id)
            return views.usage(
                r, self.clock(), self.config.time_scale, self.config.price_per_gpu_hour
            )

    # ---- sessions ----------------------------------------------------------------------------
    def session(self, session_id: str) -> SessionRecord:
        s = self.sessions.get(session_id)
        if s is None or s.project_id != self.config.project_id:
            raise RequestError(404, NOT_FOUND, f"training session {session_id!r} not found")
        return s

    def _touch_session(self, session_id: str) -> None:
        s = self.sessions.get(session_id)
        r = self.resources.get(s.resource_id) if s else None
        if r is not None:
            r.last_activity = self.clock()

    def _end_session(self, s: SessionRecord, now: float, status: str) -> None:
        """Mark the session ended; its queued operations fail, then the engine drops it."""
        s.status, s.updated_at = status, now
        host = self.hosts.get(s.resource_id)
        if host is not None:
            sid = s.id
            if hasattr(host, "cancel"):  # its running operation ends early (a sample: next token)
                host.cancel(sid)

            def close() -> None:
                with contextlib.suppress(Exception):  # never opened, or already gone
                    host.close_session(sid)

            self.ops.enqueue_internal(s.id, close, now)
        self.ops.close(s.id)

    def open_session(self, s: SessionRecord, resume: CheckpointRecord | None, note: str) -> Any:
        """Queue the job that opens the session on its engine (and loads `resume`)."""

        def work() -> dict[str, Any]:
            try:
                host = self.host_for(s.resource_id)
                host.open_session(s.id, s.lora_config)
                if resume is not None:
                    host.load_training_checkpoint(
                        s.id,
                        self.store.checkpoint_dir(resume.id),
                        load_optimizer=s.load_optimizer or bool(note),
                    )
            except Exception as exc:
                with self.lock:
                    if s.status == S_CREATING:
                        self.session_failed_to_open(s, f"the session could not start: {exc}")
                raise
            with self.lock:
                if s.status != S_CREATING:
                    return {}
                s.status, s.updated_at = S_RUNNING, self.clock()
                s.step = int(host.step(s.id))
                s.policy_state = dict(host.policy_state(s.id))
                if note:
                    s.metadata = {**s.metadata, "emulator_restart": note}
                self.save()
            return {}

        return self.ops.enqueue_internal(s.id, work, self.clock())

    def session_failed_to_open(self, s: SessionRecord, message: str, drop: bool = False) -> None:
        with self.lock:
            if drop:
                self.sessions.pop(s.id, None)
            else:
                s.status, s.updated_at = S_ERROR, self.clock()
                s.error = {
                    "code": SESSION_FAILED,
                    "message": message,
                    "occurred_at": views.ts(s.updated_at),
                }
            self.ops.close(s.id)
            self.save()

    def stop_session(self, session_id: str) -> SessionRecord:
        with self.lock:
            s = self.session(session_id)
            if s.status in S_ACTIVE:
                self._end_session(s, self.clock(), S_STOPPED)
                self.save()
            return s

    # ---- restart -----------------------------------------------------------------------------
    def _recover(self) -> None:
        now = self.clock()
        down_at = min(self.store.last_alive() or now, now)
        for r in self.resources.values():
            if r.status == R_STOPPING:
                r.status, r.stopped_at, r.updated_at = R_STOPPED, down_at, now
            elif r.status in (R_CREATING, R_READY):
                r.last_activity = now  # the emulator's downtime does not eat the idle budget
                if r.ready_at is not None:  # bill up to the crash, at the scale it ran under
                    since = r.billing_since if r.billing_since is not None else r.ready_at
                    scale = r.billing_scale or self.config.time_scale or 1.0
                    r.billed_s += max(0.0, down_at - since) / scale
                    r.unbilled_downtime_s += max(0.0, now - max(down_at, since))
                    r.billing_since, r.billing_scale = now, self.config.time_scale
                self._load_host(r)
        for s in self.sessions.values():
            if s.status not in S_ACTIVE:
                continue
            owner = self.resources.get(s.resource_id)
            if (
                s.status == "TRAINING_SESSION_STATUS_STOPPING"
                or owner is None
                or owner.status not in (R_CREATING, R_READY)
            ):
                s.status, s.updated_at = S_STOPPED, now
                continue
            ckpts = [self.checkpoints[c] for c in s.training_checkpoints if c in self.checkpoints]
            if not ckpts:
                s.status, s.updated_at = S_ERROR, now
                s.error = {
                    "code": SESSION_FAILED,
                    "message": "the emulator restarted and this session's trainer state lived "
                    "only in memory (it has no training checkpoint): start a new session "
                    "(resume_from_checkpoint_id from another session's checkpoint if you have one)",
                    "occurred_at": views.ts(now),
                }
                continue
            latest = max(ckpts, key=lambda c: (c.step, c.created_at))
            s.status, s.updated_at = S_CREATING, now
            note = (
                f"the emulator restarted at {views.ts(now)}: rolled back from step {s.step} to "
                f"training checkpoint {latest.id} (step {latest.step}); operations after it were "
                "lost"
            )
            rollback = {
                "at": views.ts(now),
                "checkpoint": latest.id,
                "from_step": s.step,
                "to_step": latest.step,
            }
            history = s.metadata.get(ROLLBACKS)
            s.metadata = {
                **s.metadata,
                ROLLBACKS: [*(history if isinstance(history, list) else []), rollback],
            }
            self.open_session(s, latest, note)
        self.save()
