"""What a Tinker script's Model Resources cost, said when the script ends.

A Model Resource bills its GPUs from READY until it stops. At the interpreter's exit, after every
client has given its session back, each `ResourcePool` that provisioned or borrowed a resource
prints to stderr one line of what its resources cost, and one line per resource still running (a
borrowed one, or one whose stop failed), which bills until someone stops it.

The cost is the platform's, not this process's stopwatch: where the endpoint is the tgnb home's
emulator, its usage report (the bill itself, in its platform time); else the API's hourly price
times the time between the service's own timestamps: the resource record's ``updated_at`` when
it was read READY, and the one its stop answered. (Counting from when the create call returned,
after more round trips, and on this machine's clock, read 8-25 % under the emulator's bill for
short scripts; at a time scale it was off by that scale.) The line also says the inactivity
timeout its resources were created with.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tgnb.connection import Endpoint, with_home_emulator
from tgnb.events import maybe_time, utcnow
from tgnb.prices import money
from tgnb.tinker._support import log

ACTIVE = {
    "MODEL_RESOURCES_STATUS_PENDING",
    "MODEL_RESOURCES_STATUS_CREATING",
    "MODEL_RESOURCES_STATUS_READY",
}


service_time = maybe_time  # a service record's timestamp, None when missing or unreadable


@dataclass
class Seen:
    """One resource a pool held: on what, READY since when and stopped when (the service's
    timestamps; a borrowed one's: from when this script attached it)."""

    resource_id: str
    base_model: str
    owned: bool
    generators: int
    price: tuple[float, str] | None  # per hour, currency (the API's estimate-cost)
    ready_at: datetime | None = field(default_factory=utcnow)
    stopped_at: datetime | None = None  # None: not seen stopping

    @property
    def gpus(self) -> int:
        return 1 + self.generators

    @property
    def stopped_seen(self) -> bool:
        return self.stopped_at is not None

    def stopped(self, record: Any) -> None:
        """Note the record a stop answered (its ``updated_at``: when the service stopped it)."""
        self.stopped_at = service_time(getattr(record, "updated_at", None)) or utcnow()

    def hours(self) -> float:
        if self.ready_at is None:
            return 0.0
        return max(((self.stopped_at or utcnow()) - self.ready_at).total_seconds(), 0.0) / 3600


def _billed(conn: Endpoint, s: Seen) -> tuple[float, str] | None:
    """What `s` cost: the emulator's bill where there is one, else price x the service's times."""
    if conn.emulator is not None and s.owned:
        usage = conn.emulator.usage(s.resource_id)
        if usage is not None and isinstance(usage.get("cost"), (int, float)):
            return float(usage["cost"]), str(usage.get("currency") or "USD")
    if s.price is None:
        return None
    return s.price[0] * s.hours(), s.price[1]


def price_of(conn: Endpoint, base_model: str, generators: int) -> tuple[float, str] | None:
    """(price per hour, currency) from the API's estimate-cost; None if it cannot say."""
    try:
        r = conn.sdk().post_training.model_resources.estimate_cost(
            base_model=base_model,
            compute_config={"num_generator_replicas": generators},
            lora_enabled=True,
        )
        return float(r.price_per_hour), str(r.currency)
    except Exception as exc:  # a cost report must not fail the script
        log.debug("estimate-cost for %s failed: %r", base_model, exc)
        return None


def _status(conn: Endpoint, resource_id: str) -> str | None:
    try:
        return str(conn.sdk().post_training.model_resources.retrieve(resource_id).status)
    except Exception as exc:
        log.debug("reading model resources %s failed: %r", resource_id, exc)
        return None


def _precise(amount: float, currency: str) -> str:
    """Dollars to the hundredth of a cent under $10 (a short script's $0.0190, not $0.02: the
    figure agrees with the bill to 2 %), else as every amount of tgnb is written."""
    if currency.upper() == "USD" and 0 < amount < 10:
        return f"${amount:.4f}"
    return money(amount, currency)


def lines(conn: Endpoint, seen: Iterable[Seen], inactive_timeout: int | None = None) -> list[str]:
    """The exit report of `seen` (empty when nothing was held)."""
    seen = list(seen)
    if not seen:
        return []
    conn = with_home_emulator(conn)
    out = []
    amount, currency, priced = 0.0, "USD", True
    running = []
    for s in seen:
        price = s.price
        cost = _billed(conn, s)
        if cost is None:
            priced = False
        else:
            amount += cost[0]
            currency = cost[1]
        if not s.stopped_seen and _status(conn, s.resource_id) in ACTIVE:
            running.append((s, price))
    gpus = sum(s.gpus for s in seen)
    cost_text = (
        f"about {_precise(amount, currency)}" if priced else "price unknown (estimate-cost failed)"
    )
    source = (
        "the emulator's bill"
        if conn.emulator is not None
        else "hourly price x the time the service had them READY"
    )
    idle = (
        f"; created to stop themselves after {inactive_timeout} s without an operation"
        f" ($TGNB_PT_INACTIVE_TIMEOUT)"
        if inactive_timeout and any(s.owned for s in seen)
        else ""
    )
    out.append(
        f"tgnb.tinker: this script held {len(seen)} model resource(s), {gpus} GPU(s): "
        f"{cost_text} ({source}){idle}"
    )
    for s, price in running:
        rate = f"{money(price[0], price[1])}/hour" if price else "its hourly price"
        why = "borrowed (model_resources_id)" if not s.owned else "its stop failed"
        out.append(
            f"tgnb.tinker: model resources {s.resource_id} ({s.base_model}, {s.gpus} GPU(s)) "
            f"still running after this script, {why}: it bills {rate} until stopped "
            f"(%tg pt stop --resource {s.resource_id} --force, or the SDK's "
            "ModelResourcesClient.attach(...).stop(force=True))"
        )
    return out


def print_report(conn: Endpoint, seen: Iterable[Seen], inactive_timeout: int | None = None) -> None:
    for line in lines(conn, seen, inactive_timeout):
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError, RuntimeError):  # stderr closed (or in use by the thread
            # a signal interrupted: a reentrant write): the registry still has what ran
            return
