"""What a Tinker script's Model Resources cost, said when the script ends.

A Model Resource bills its GPUs from READY until it stops. At the interpreter's exit, after every
client has given its session back, each `ResourcePool` that provisioned or borrowed a resource
prints to stderr one line of what its resources cost (the API's hourly price, times the
wall-clock time this script saw them READY), and one line per resource still running (a
borrowed one, or one whose stop failed), which bills until someone stops it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tgnb.connection import Endpoint
from tgnb.prices import money
from tgnb.tinker._support import log

ACTIVE = {
    "MODEL_RESOURCES_STATUS_PENDING",
    "MODEL_RESOURCES_STATUS_CREATING",
    "MODEL_RESOURCES_STATUS_READY",
}


@dataclass
class Seen:
    """One resource a pool held: since when (monotonic seconds), until when, on what."""

    resource_id: str
    base_model: str
    owned: bool
    generators: int
    price: tuple[float, str] | None  # per hour, currency (the API's estimate-cost)
    since: float = field(default_factory=time.monotonic)
    until: float | None = None  # when this script saw it stop (None: not seen stopping)

    @property
    def gpus(self) -> int:
        return 1 + self.generators

    def hours(self) -> float:
        return ((self.until or time.monotonic()) - self.since) / 3600.0


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


def lines(conn: Endpoint, seen: Iterable[Seen]) -> list[str]:
    """The exit report of `seen` (empty when nothing was held)."""
    seen = list(seen)
    if not seen:
        return []
    out = []
    amount, currency, priced = 0.0, "USD", True
    running = []
    for s in seen:
        price = s.price
        if price is None:
            priced = False
        else:
            amount += price[0] * s.hours()
            currency = price[1]
        if s.until is None and _status(conn, s.resource_id) in ACTIVE:
            running.append((s, price))
    gpus = sum(s.gpus for s in seen)
    cost = f"about {money(amount, currency)}" if priced else "price unknown (estimate-cost failed)"
    out.append(
        f"tgnb.tinker: this script held {len(seen)} model resource(s), {gpus} GPU(s): {cost} "
        "(hourly price x the wall-clock time it saw them READY)"
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


def print_report(conn: Endpoint, seen: Iterable[Seen]) -> None:
    for line in lines(conn, seen):
        print(line, file=sys.stderr, flush=True)
