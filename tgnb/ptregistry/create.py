"""Creating a model resource so that no interruption leaves it unrecorded.

`create` writes the registry's entry first (`store.Registry.new`), then sends
``POST /v1/rl/model-resources`` once, with the entry's key as its ``Idempotency-Key`` and the
SDK's own retries off: after a transient failure `tgnb.cloud.client.RetryPolicy` reads the
resources back (`match`: one created since the entry was written, with the same generators and
timeout, that no other entry claims) and adopts it rather than sending again; only when none
is there is the same request (same key) sent again. The id goes into the entry as soon as the
answer comes; then it waits for READY (the service's record read every `interval`) and notes the
service's own time of READY. Any failure or interruption while it waits stops the resource
(force) before it propagates; one before the answer leaves the entry for the next process
(`tgnb.ptregistry.leftovers` resolves it by `match`).

`inactive_timeout` defaults to `default_inactive_timeout()`: a resource whose process was killed
stops itself after that many seconds without an operation, where the API's own default is an hour.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tgnb.cloud.client import RetryPolicy, is_transient
from tgnb.errors import ApiError, ConfigError, TgnbError
from tgnb.events import format_time, maybe_time, parse_time
from tgnb.ptregistry.store import Entry, Registry, mine, root_of

if TYPE_CHECKING:
    from together.post_training import ModelResourcesClient

    from tgnb.connection import Endpoint

#: Seconds without an operation before a resource tgnb creates stops itself (the API's default is
#: 3600; its range 300-86400). ``TGNB_PT_INACTIVE_TIMEOUT`` sets another, or an explicit argument.
DEFAULT_INACTIVE_TIMEOUT = 900
TIMEOUT_ENV = "TGNB_PT_INACTIVE_TIMEOUT"
TIMEOUT_RANGE = (300, 86400)

READY = "MODEL_RESOURCES_STATUS_READY"
ENDED = {
    "MODEL_RESOURCES_STATUS_ERROR",
    "MODEL_RESOURCES_STATUS_STOPPING",
    "MODEL_RESOURCES_STATUS_STOPPED",
}
#: How far before an entry's ``sent_at`` a resource's ``created_at`` may be and still be its
#: (this machine's clock against the service's).
CLOCK_SKEW = timedelta(seconds=120)


def default_inactive_timeout() -> int:
    """`DEFAULT_INACTIVE_TIMEOUT`, or ``$TGNB_PT_INACTIVE_TIMEOUT`` when set (checked)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_INACTIVE_TIMEOUT
    low, high = TIMEOUT_RANGE
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not low <= value <= high:
        raise ConfigError(
            f"{TIMEOUT_ENV}={raw!r}: give whole seconds from {low} to {high}, e.g. "
            f"{TIMEOUT_ENV}=900 (or unset it for the default, {DEFAULT_INACTIVE_TIMEOUT})"
        )
    return value


#: A timestamp of the service's records (ISO text or a datetime); None if unreadable.
as_time = maybe_time


def match(records: list[Any], entry: Entry, claimed: set[str]) -> Any | None:
    """The resource among `records` (the API's list) that `entry`'s create made: with its
    generators and inactivity timeout, claimed by no other entry, created since the entry was
    written: the first after it (one up to `CLOCK_SKEW` before it only if none is after: the two
    clocks may differ). Not by model name: the service may answer another name for the model
    asked, as the emulator answers its local directory for an alias."""
    sent = parse_time(entry.sent_at)
    since = sent - CLOCK_SKEW
    found = []
    for r in records:
        created = as_time(getattr(r, "created_at", None))
        compute = getattr(r, "compute_config", None)
        generators = int(getattr(compute, "num_generator_replicas", 0) or 0)
        timeout = getattr(r, "inactive_timeout", None)
        if (
            str(r.id) not in claimed
            and generators == entry.generators
            and (entry.inactive_timeout is None or timeout in (None, entry.inactive_timeout))
            and created is not None
            and created >= since
        ):
            found.append(((created < sent, abs((created - sent).total_seconds())), r))
    found.sort(key=lambda pair: pair[0])
    return found[0][1] if found else None


def listed(conn: Endpoint) -> list[Any]:
    """The project's model resources, as the API lists them (up to 20 pages)."""
    items: list[Any] = []
    after: str | None = None
    for _ in range(20):
        kw: dict[str, Any] = {"limit": 100}
        if after:
            kw["after"] = after
        page = conn.sdk().post_training.model_resources.list(**kw)
        items += list(page.data or [])
        after = getattr(getattr(page, "meta", None), "next_cursor", None)
        if not after:
            break
    return items


def say(text: str) -> None:
    """A progress line on stdout, as the SDK's create prints; a closed stdout is no failure."""
    with contextlib.suppress(OSError, ValueError):
        print(text, flush=True)


def create(
    conn: Endpoint,
    *,
    base_model: str,
    generators: int,
    by: str,
    lora: bool = True,
    inactive_timeout: int | None = None,
    ready_timeout: float | None = None,
    interval: float = 1.0,
) -> tuple[ModelResourcesClient, Entry]:
    """A READY model resource and its registry entry (see the module docstring)."""
    from together.post_training import ModelResourcesClient

    timeout = default_inactive_timeout() if inactive_timeout is None else inactive_timeout
    registry = Registry(conn.home)
    entry = registry.new(conn.base_url, base_model, generators, timeout, by)
    body: dict[str, Any] = {
        "base_model": base_model,
        "lora_enabled": lora,
        "compute_config": {"num_generator_replicas": generators},
        "inactive_timeout": timeout,
    }
    once = conn.sdk().with_options(max_retries=0)

    def send() -> Any:
        headers = {"Idempotency-Key": entry.key}
        return once.post_training.model_resources.create(**body, extra_headers=headers)

    def read_back() -> Any | None:
        claimed = {e.resource_id for e in registry.entries() if e.resource_id and e is not entry}
        return match(listed(conn), entry, claimed)

    try:
        record = RetryPolicy(attempts=4).call(
            send,
            what=f"create a model resource for {base_model}",
            base_url=conn.base_url,
            read_back=read_back,
        )
    except TgnbError as exc:
        # the SDK's own error, as the SDK's create raised it: each caller words it its own way
        # (`Endpoint.call`); a refusal drops its entry (nothing was created), a failure that may
        # have been applied keeps it (the next process resolves it)
        cause = exc.__context__
        if cause is not None and not isinstance(cause, TgnbError):
            if not is_transient(cause):
                registry.forget(entry)
            raise cause from None
        raise
    entry.resource_id = str(record.id)
    registry.save(entry)
    tag = f"[model-resources:{entry.resource_id}]"
    say(f"{tag} created (inactive_timeout {timeout} s), waiting for READY status...")
    try:
        ready = _wait_ready(conn, entry.resource_id, ready_timeout, interval)
        entry.ready_at = format_time(as_time(ready.updated_at) or parse_time(entry.sent_at))
        registry.save(entry)
        client = ModelResourcesClient.attach(model_resources_id=entry.resource_id, **conn.native())
    except BaseException as exc:
        say(f"{tag} stopping model resources due to {type(exc).__name__}...")
        try:
            conn.sdk().post_training.model_resources.stop(entry.resource_id, force=True)
            registry.forget(entry)
        except Exception as cleanup:  # the entry stays: the next process names it
            with contextlib.suppress(OSError, ValueError):
                print(f"{tag} its stop failed: {cleanup!r}", file=sys.stderr, flush=True)
        raise
    return client, entry


def stop_mine(conn: Endpoint) -> list[tuple[str, Any]]:
    """Stop (force: their sessions too) every resource this process created and still holds on
    `conn`'s endpoint, and drop their entries: ``(id, the record the stop answered)`` each. An
    entry whose create has no answer yet stays (the next process resolves it). Takes no lock of
    tgnb's: for a signal's handler, which may run in a thread that holds one."""
    registry = Registry(conn.home)
    stopped = []
    for entry in mine():
        if entry.resource_id is None or entry.root != root_of(conn.base_url) or not entry.mine:
            continue  # (not mine: a forked child's copy of its parent's entries)
        try:
            record = conn.sdk().post_training.model_resources.stop(entry.resource_id, force=True)
        except Exception as exc:  # its entry stays: the next process names it
            with contextlib.suppress(OSError, ValueError, RuntimeError):  # (a reentrant write)
                print(f"stopping {entry.resource_id} failed: {exc!r}", file=sys.stderr)
            continue
        registry.forget(entry)
        stopped.append((entry.resource_id, record))
    return stopped


def _wait_ready(conn: Endpoint, resource_id: str, timeout: float | None, interval: float) -> Any:
    start = time.monotonic()
    while True:
        current = conn.sdk().post_training.model_resources.retrieve(resource_id)
        if current.status == READY:
            say(f"[model-resources:{resource_id}] ready in {time.monotonic() - start:.1f}s")
            return current
        if current.status in ENDED:
            raise ApiError(f"model resources {resource_id} entered {current.status} before READY")
        if timeout is not None and time.monotonic() - start >= timeout:
            raise TimeoutError(f"model resources {resource_id} not READY after {timeout} s")
        time.sleep(interval)


__all__ = [
    "DEFAULT_INACTIVE_TIMEOUT",
    "TIMEOUT_ENV",
    "as_time",
    "create",
    "default_inactive_timeout",
    "listed",
    "match",
    "stop_mine",
]
