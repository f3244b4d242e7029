"""The model resources one `ServiceClient` holds, shared by the clients it opens.

On Tinker, clients cost by the work they do; on Post-Training a Model Resource bills its GPUs from
READY until it stops, whatever runs on it, and takes up to `MAX_SESSIONS` LoRA sessions. So the
clients of one ``ServiceClient`` (training clients, and samplers on saved weights) open their
sessions on one resource per base model until it holds `MAX_SESSIONS`, and only then is another
provisioned. Training starts on a resource with no generator (supervised work never samples, so
it pays for the trainer's GPU only); the first sampler a training client asks for moves its
session onto a resource with a generator (`TrainingClient`), where samplers on saved weights
open too. A resource is stopped when the last session on it is (a borrowed one, the
``model_resources_id`` given, is only detached); each client's ``close()`` or the interpreter's
exit gives its session back. Five clients of one service client: one resource, not five. At
exit, a line says what they cost, and one per resource left running (`_report`).

Each resource it provisions is recorded in the registry of the tgnb home before its create is
sent (`tgnb.ptregistry`), with an inactivity timeout (`tgnb.ptregistry.default_inactive_timeout`),
so a script killed at any point leaves it named to the next one and stopping itself; its entry is
dropped once it is stopped. `stop_everything` stops every resource the process created (SIGTERM
and SIGINT do, `_signals`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from together.post_training import ModelResourcesClient

from tgnb import ptregistry
from tgnb.connection import Endpoint
from tgnb.tinker._report import Seen, price_of, print_report, service_time
from tgnb.tinker._support import POLL_INTERVAL, Release, wait_for_releases

#: LoRA sessions one Model Resource takes (Together's documented cap; over it the API answers 429).
MAX_SESSIONS = 5


@dataclass
class _Held:
    client: ModelResourcesClient
    base_model: str
    owned: bool
    seen: Seen
    sessions: int = 0
    entry: ptregistry.Entry | None = None  # the registry's (an owned resource's)

    @property
    def label(self) -> str:
        kind = "" if self.owned else " (borrowed)"
        return f"model resources {self.client.model_resources_id}{kind}"


class ResourcePool:
    """Leases sessions on shared resources (see the module docstring). Thread-safe: clients
    created at once (``asyncio.gather`` of ``create_*_async``) share, not race."""

    def __init__(self, conn: Endpoint, model_resources_id: str | None = None) -> None:
        self._conn = conn
        self._borrowed = model_resources_id
        self._held: list[_Held] = []
        self._seen: list[Seen] = []  # every resource it held, for the exit report
        self._lock = threading.Lock()
        self.inactive_timeout = ptregistry.default_inactive_timeout()
        self._reported = False
        _POOLS.add(self)
        threading._register_atexit(self._report)  # type: ignore[attr-defined]  # after the clients'

    def _report(self) -> None:
        if self._reported:
            return
        # dropped samplers give their sessions back on a thread of their own: wait for what is
        # queued there, else a resource whose last release is pending reads "its stop failed"
        with contextlib.suppress(RuntimeError, TimeoutError):  # the interpreter may be going
            wait_for_releases(timeout=120)
        with self._lock:
            seen = list(self._seen)
        print_report(self._conn, seen, self.inactive_timeout)

    @property
    def resource_ids(self) -> list[str]:
        """The resources held now (for tests and the exit report)."""
        with self._lock:
            return [h.client.model_resources_id for h in self._held]

    def open(
        self, base_model: str, lora: dict[str, Any], *, sampling: bool, **resume: Any
    ) -> tuple[Any, Release]:
        """A new session for `base_model` and what gives it (and its lease) back, in order; on a
        resource with a generator when `sampling`, else on any (a new one gets none)."""
        held = self._lease(base_model, sampling)
        release = Release()
        release.add(held.label, functools.partial(self._give_back, held))
        try:
            session = held.client.create_session(
                lora_config=lora,  # type: ignore[arg-type]
                interval=POLL_INTERVAL,
                **resume,
            )
            release.add(f"session {session.session_id}", session.stop, first=True)
        except BaseException:
            release.close(automatic=True)
            raise
        return session, release

    def generators(self, resource_id: str) -> int | None:
        """The generators of resource `resource_id` this pool provisioned (None: not one, e.g.
        the borrowed one, which serves every client as it is)."""
        with self._lock:
            found = [
                h for h in self._held if h.client.model_resources_id == resource_id and h.owned
            ]
        return found[0].seen.generators if found else None

    def _lease(self, base_model: str, sampling: bool) -> _Held:
        with self._lock:  # held while provisioning: clients opened at once share one resource
            for held in self._held:
                fits = held.seen.generators > 0 or not sampling or not held.owned
                if held.base_model == base_model and held.sessions < MAX_SESSIONS and fits:
                    held.sessions += 1
                    return held
            held = self._provision(base_model, sampling)
            held.sessions = 1
            self._held.append(held)
            self._seen.append(held.seen)
            return held

    def _provision(self, base_model: str, sampling: bool) -> _Held:
        if self._borrowed is None:
            mr, entry = ptregistry.create(
                self._conn,
                base_model=base_model,
                generators=1 if sampling else 0,
                by="tgnb.tinker",
                inactive_timeout=self.inactive_timeout,
                interval=POLL_INTERVAL,
            )
            seen = self._seen_now(mr, base_model, owned=True)
            seen.ready_at = service_time(entry.ready_at)
            return _Held(mr, base_model, True, seen, entry=entry)
        if any(not h.owned for h in self._held):
            raise RuntimeError(
                f"model resources {self._borrowed} already hold {MAX_SESSIONS} sessions of this "
                "service client: close a client first, or pass no model_resources_id"
            )
        mr = ModelResourcesClient.attach(model_resources_id=self._borrowed, **self._conn.native())
        attached = mr.retrieve()
        if attached.base_model != base_model:
            mr.detach()
            raise ValueError(
                f"model resources {self._borrowed} serve {attached.base_model!r}, "
                f"not {base_model!r}: pass another model_resources_id, or none"
            )
        return _Held(mr, base_model, False, self._seen_now(mr, base_model, owned=False))

    def note_stopped(self, stopped: dict[str, Any], report: bool, conn: Endpoint) -> None:
        """Note the stops a signal's handler made (`stop_everything`), taking no lock; print the
        exit report now when `report` (the process ends with no exit hooks), read through `conn`
        (the handler's own clients)."""
        for seen in list(self._seen):
            if seen.resource_id in stopped:
                seen.stopped(stopped[seen.resource_id])
        if report:
            self._reported = True
            print_report(conn, list(self._seen), self.inactive_timeout)

    def _seen_now(self, mr: ModelResourcesClient, base_model: str, *, owned: bool) -> Seen:
        record = mr.retrieve()
        generators = int(getattr(record.compute_config, "num_generator_replicas", 0) or 0)
        price = price_of(self._conn, base_model, generators)
        return Seen(mr.model_resources_id, base_model, owned, generators, price)

    def _give_back(self, held: _Held) -> None:
        with self._lock:
            held.sessions -= 1
            if held.sessions > 0:
                return
            if held in self._held:
                self._held.remove(held)
        if held.owned:
            held.seen.stopped(held.client.stop(force=True))
            if held.entry is not None:
                ptregistry.Registry(self._conn.home).forget(held.entry)
        else:
            held.client.detach()


#: Every pool of this process (`stop_everything`).
_POOLS: weakref.WeakSet[ResourcePool] = weakref.WeakSet()


def stop_everything(report: bool = False) -> None:
    """Stop (force: their sessions too) every resource this process created, as a signal's
    handler must (`_signals`): with no lock of tgnb's (the thread it interrupts may hold a pool's
    while it provisions) and through clients of its own (`Endpoint.fresh`: that thread may be
    inside an HTTP request of the endpoint's client); what the clients' releases do later finds
    them stopped."""
    pools = list(_POOLS)
    stopped: dict[str, Any] = {}
    fresh = {conn: conn.fresh() for conn in {pool._conn for pool in pools}}
    for endpoint in fresh.values():
        stopped.update(ptregistry.stop_mine(endpoint))
    for pool in pools:
        pool.note_stopped(stopped, report, fresh[pool._conn])
