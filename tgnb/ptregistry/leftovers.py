"""Leftovers: resources tgnb created that still hold GPUs while no live process holds them.

`find` reads the registry's entries of one endpoint whose holder is gone (`store.Entry.held`),
resolves an entry with no id yet (its process died before the create's answer) by `create.match`,
and asks the service about each: an ended or unknown resource's entry is dropped (nothing bills),
an active one is a `Leftover`, with what it has cost so far (`billed`). `stop` stops them (force:
their sessions too) and drops their entries. `lines` says them to a person.

What a leftover has cost comes from the platform, never from when this process first looked:
the emulator's usage report (its bill) where the endpoint is the emulator, else the API's
estimate-cost price times the time since the service's READY (its record's ``updated_at`` as the
holder read it at READY, kept in the entry; without it, the record's ``created_at``, which also
counts the provisioning: an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tgnb.events import format_time, parse_time, utcnow
from tgnb.prices import money
from tgnb.ptregistry.create import ENDED, READY, as_time, listed, match
from tgnb.ptregistry.store import Entry, Registry, root_of

if TYPE_CHECKING:
    from tgnb.connection import Endpoint

#: An entry with no id whose create found nothing for this long was never created: dropped.
NEVER_CREATED = timedelta(minutes=15)
STOP_HINT = "tgnb pt stop --leftovers"


@dataclass(frozen=True)
class Billed:
    """What a resource has cost since READY, and from which source."""

    amount: float | None  # None: no price known
    currency: str
    price_per_hour: float | None
    since: datetime | None  # READY (None: not READY yet)
    source: str  # "the emulator's bill", "the service's READY time", "its created_at (upper bound)"


@dataclass(frozen=True)
class Leftover:
    entry: Entry
    resource_id: str
    status: str  # the API's, without its prefix
    base_model: str
    gpus: int
    inactive_timeout: int | None
    billed: Billed


def _label(status: str) -> str:
    return status.removeprefix("MODEL_RESOURCES_STATUS_")


def _price(conn: Endpoint, record: Any, cache: dict[tuple[str, int], Any]) -> Any:
    compute = getattr(record, "compute_config", None)
    n = int(getattr(compute, "num_generator_replicas", 0) or 0)
    key = (str(record.base_model), n)
    if key not in cache:
        try:
            cache[key] = conn.sdk().post_training.model_resources.estimate_cost(
                base_model=key[0],
                compute_config={"num_generator_replicas": n},
                lora_enabled=bool(getattr(record, "lora_enabled", True)),
            )
        except Exception:  # a price we cannot get is said, not guessed
            cache[key] = None
    return cache[key]


def billed(
    conn: Endpoint,
    record: Any,
    ready_at: str | None = None,
    cache: dict[tuple[str, int], Any] | None = None,
) -> Billed:
    """What resource `record` (the API's) has cost since READY (see the module docstring);
    `ready_at`: the service's READY time as its holder read it, if known."""
    if conn.emulator is not None:
        usage = conn.emulator.usage(str(record.id))
        if usage is not None and isinstance(usage.get("cost"), (int, float)):
            hourly = float(usage.get("price_per_gpu_hour") or 0) * int(usage.get("gpus") or 1)
            return Billed(
                float(usage["cost"]),
                str(usage.get("currency") or "USD"),
                hourly,
                as_time(usage.get("ready_at")),
                "the emulator's bill",
            )
    price = _price(conn, record, {} if cache is None else cache)
    status = str(record.status)
    since = as_time(ready_at)
    source = "the service's READY time"
    if since is None:
        since, source = as_time(getattr(record, "created_at", None)), "its created_at (upper bound)"
    if status != READY and status not in ENDED:
        since = None  # queued or provisioning: not billing yet
    if price is None:
        return Billed(None, "USD", None, since, source)
    hourly, currency = float(price.price_per_hour), str(price.currency)
    end = as_time(getattr(record, "updated_at", None)) if status in ENDED else utcnow()
    hours = 0.0 if since is None or end is None else max((end - since).total_seconds(), 0) / 3600
    return Billed(hourly * hours, currency, hourly, since, source)


def find(conn: Endpoint) -> list[Leftover]:
    """The leftovers of `conn`'s endpoint (see the module docstring), oldest first."""
    registry = Registry(conn.home)
    gone = [e for e in registry.entries(root_of(conn.base_url)) if not e.held]
    if not gone:
        return []
    records = {str(r.id): r for r in listed(conn)}
    claimed = {e.resource_id for e in registry.entries() if e.resource_id}
    prices: dict[tuple[str, int], Any] = {}
    out = []
    for entry in gone:
        if entry.resource_id is None:
            record = match(list(records.values()), entry, {c for c in claimed if c})
            if record is None:
                if utcnow() - parse_time(entry.sent_at) > NEVER_CREATED:
                    registry.forget(entry)  # its create never landed
                continue
            entry.resource_id = str(record.id)
            claimed.add(entry.resource_id)
            registry.save(entry)
        record = records.get(entry.resource_id)
        if record is None or str(record.status) in ENDED:
            registry.forget(entry)
            continue
        compute = getattr(record, "compute_config", None)
        out.append(
            Leftover(
                entry,
                entry.resource_id,
                _label(str(record.status)),
                str(record.base_model),
                1 + int(getattr(compute, "num_generator_replicas", 0) or 0),
                getattr(record, "inactive_timeout", None),
                billed(conn, record, entry.ready_at, prices),
            )
        )
    return out


def stop(conn: Endpoint, leftovers: list[Leftover]) -> list[tuple[str, str]]:
    """Stop each leftover (force: its sessions too) and drop its entry: ``(id, status)`` each."""
    registry = Registry(conn.home)
    out = []
    for left in leftovers:
        record = conn.sdk().post_training.model_resources.stop(left.resource_id, force=True)
        registry.forget(left.entry)
        out.append((left.resource_id, _label(str(record.status))))
    return out


def describe(left: Leftover) -> str:
    """One line: which resource, whose, since when, what it has cost and bills."""
    b = left.billed
    cost = "price unknown (estimate-cost failed)"
    if b.amount is not None:
        rate = f", billing {money(b.price_per_hour or 0.0, b.currency)}/hour" if b.since else ""
        cost = f"{money(b.amount, b.currency)} so far ({b.source}){rate}"
    since = f" since {format_time(b.since)}" if b.since else ""
    idle = (
        f"; it stops itself after {left.inactive_timeout} s without an operation"
        if left.inactive_timeout
        else ""
    )
    e = left.entry
    return (
        f"model resources {left.resource_id} ({left.base_model}, {left.gpus} GPU(s)) "
        f"{left.status}{since}, created by {e.by} (pid {e.pid}, no longer running): {cost}{idle}"
    )


def lines(leftovers: list[Leftover], prefix: str = "tgnb") -> list[str]:
    """What to tell a person about `leftovers` (nothing when there are none)."""
    if not leftovers:
        return []
    out = [
        f"{prefix}: {len(leftovers)} model resource(s) left running by processes that are gone "
        f"(stop them: {STOP_HINT}):"
    ]
    out += [f"{prefix}:   {describe(left)}" for left in leftovers]
    return out


__all__ = ["STOP_HINT", "Billed", "Leftover", "billed", "describe", "find", "lines", "stop"]
