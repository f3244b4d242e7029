"""An incremental feed of a cluster's events: each poll returns only what is new since the last.

The API returns the whole ``node_lifecycle_events`` list (72 h, de-duplicated by node and reason)
on every read; `EventFeed` remembers what it has handed out and returns the rest, oldest first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tgnb.events import Event, dedupe

if TYPE_CHECKING:
    from tgnb.cloud.models import ClusterState


class EventFeed:
    """Events not yet seen, from successive cluster snapshots (or any iterable of events).

    `fetch` returns a fresh `ClusterState` (e.g. ``Cluster.state``); `poll()` calls it and returns
    the new events. `add()` feeds events tgnb records itself (a target change) into the same feed.
    """

    def __init__(
        self, fetch: Callable[[], ClusterState] | None = None, since: datetime | None = None
    ) -> None:
        self._fetch = fetch
        self._since = since
        self._seen: set[tuple[Any, ...]] = set()
        self._pending: list[Event] = []
        self.history: list[Event] = []

    def update(self, events: Iterable[Event]) -> list[Event]:
        """The events in `events` not handed out before (plus any added locally), oldest first."""
        fresh = [e for e in events if self._since is None or e.time >= self._since]
        new = dedupe([*self._pending, *fresh], self._seen)
        self._pending.clear()
        self.history.extend(new)
        return new

    def add(self, event: Event) -> None:
        """Queue an event recorded by tgnb itself; the next poll returns it."""
        self._pending.append(event)

    def poll(self) -> list[Event]:
        """Read the cluster once and return only the events that are new since the last poll."""
        if self._fetch is None:
            raise RuntimeError("this EventFeed has no fetch function: call update(events)")
        return self.update(self._fetch().events)
