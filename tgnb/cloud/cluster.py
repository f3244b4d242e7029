"""`Cluster`: a handle on one attached cluster (status, preemptible target, capacity wait, events)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tgnb.cloud.feed import EventFeed
from tgnb.cloud.models import ClusterState
from tgnb.cloud.rates import PreemptionRate, estimate
from tgnb.cloud.validate import check_target
from tgnb.errors import TransientApiError, ValidationError
from tgnb.events import TARGET_CHANGED, Event, parse_since, utcnow

if TYPE_CHECKING:
    from tgnb.cloud.cloud import Cloud


@dataclass(frozen=True)
class WaitResult:
    """How a wait for preemptible capacity ended.

    `reached` says whether allocated reached the target; `state` is the last snapshot read;
    `waited` is seconds spent; `polls` the number of reads.
    """

    reached: bool
    state: ClusterState
    waited: float
    polls: int

    def __bool__(self) -> bool:
        return self.reached

    def __str__(self) -> str:
        s = self.state
        verdict = "reached" if self.reached else "still short"
        return (
            f"capacity {verdict}: allocated {s.allocated_preemptible_gpus} of target "
            f"{s.desired_preemptible_gpus} preemptible GPUs after {self.waited:.1f} s "
            f"({self.polls} polls)"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """What a notebook cell shows: the sentence of `__str__`, not the repr."""
        p.text(str(self))

    def __repr__(self) -> str:
        s = self.state
        return (
            f"WaitResult(reached={self.reached}, cluster={s.name!r}, "
            f"allocated={s.allocated_preemptible_gpus}, desired={s.desired_preemptible_gpus}, "
            f"waited={self.waited:.1f}, polls={self.polls})"
        )


class Cluster:
    """One cluster on the clusters API, attached through a `Cloud`.

    `last` is the latest snapshot read; `feed` the incremental event feed behind `poll_events`.
    """

    def __init__(self, cloud: Cloud, state: ClusterState) -> None:
        self.cloud = cloud
        self.id = state.id
        self.name = state.name
        self.last = state
        self.feed = EventFeed(self.state)

    def __repr__(self) -> str:
        s = self.last
        return (
            f"<Cluster {s.name} ({s.id}) {s.type} {s.status}: preemptible target "
            f"{s.desired_preemptible_gpus}, allocated {s.allocated_preemptible_gpus}>"
        )

    def _repr_html_(self) -> str:
        return self.last._repr_html_()

    # reads -------------------------------------------------------------------------------------
    def state(self) -> ClusterState:
        """Read the cluster now (retried on transient errors) and return the snapshot."""
        cloud = self.cloud
        raw = cloud.retry.call(
            lambda: cloud.client.clusters.retrieve(self.id),
            what=f"read cluster {self.id}",
            base_url=cloud.base_url,
        )
        self.last = ClusterState.from_api(raw)
        return self.last

    def events(self, since: datetime | timedelta | str | float | None = None) -> list[Event]:
        """The cluster's node lifecycle events (de-duplicated, oldest first), at or after `since`
        (a datetime, an RFC 3339 string, a POSIX timestamp, or an age: a timedelta or ``"2h"``,
        as `Session.events` and ``%tg events --since`` take; naive datetimes are UTC)."""
        try:
            start = parse_since(since)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        events = self.state().events
        if start is None:
            return list(events)
        return [e for e in events if e.time >= start]

    def preemption_rate(self, prior: float, state: ClusterState | None = None) -> PreemptionRate:
        """Preemptions per preemptible node-hour over the events' 72 hours, with `prior` (per
        node-hour) as one node-hour of pseudo-observation (`tgnb.cloud.rates`); from `state`, or
        the cluster read now."""
        return estimate(state or self.state(), prior)

    def poll_events(self) -> list[Event]:
        """Only the events that are new since the previous call (the first call returns all)."""
        return self.feed.poll()

    # the preemptible target ------------------------------------------------------------------
    def scale(self, preemptible: int) -> ClusterState:
        """Set the preemptible GPU target and return the updated snapshot.

        Checked before any request: an int, >= 0, a multiple of 8, and, when above 0, a project
        configured on the `Cloud` (``TOGETHER_PROJECT_ID`` or ``project_id=``), as the platform
        requires. Sends only ``num_preemptible_gpus``.
        After a transient failure it reads the cluster back and sends the target again only if it
        is not applied yet, so the target is applied once.
        """
        owner = (
            f" (cluster {self.id} is in project {self.last.project_id})"
            if self.last.project_id
            else ""
        )
        target = check_target(preemptible, self.cloud.project_id, hint=owner)
        before = self.last.desired_preemptible_gpus
        state = self._apply_target(target)
        if state.desired_preemptible_gpus != before:
            self.feed.add(
                Event(
                    time=utcnow(),
                    source="tgnb",
                    reason=TARGET_CHANGED,
                    message=f"preemptible target {before} -> {target} GPUs",
                    data={"from": before, "to": target, "cluster": self.id},
                )
            )
        return state

    def _apply_target(self, target: int) -> ClusterState:
        cloud = self.cloud
        # The SDK's own retries would resend the PUT blindly; each retry reads back first.
        once = cloud.client.with_options(max_retries=0)

        def update() -> ClusterState:
            self.last = ClusterState.from_api(
                once.clusters.update(self.id, num_preemptible_gpus=target)
            )
            return self.last

        def applied() -> ClusterState | None:
            current = self.state()
            return current if current.desired_preemptible_gpus == target else None

        return cloud.once_policy().call(
            update,
            what=f"set the preemptible target of cluster {self.id} to {target}",
            base_url=cloud.base_url,
            read_back=applied,
        )

    def wait_for_capacity(
        self,
        timeout: float = 900.0,
        poll: float = 10.0,
        callback: Callable[[ClusterState], Any] | None = None,
    ) -> WaitResult:
        """Poll until allocated preemptible GPUs reach the target, or `timeout` seconds pass.

        `callback(state)` is called after every read (progress bars and widgets use it). Capacity
        that stays short is not an error: the result says ``reached=False``. A read that fails
        transiently counts as a poll and the wait goes on; other errors propagate.
        """
        start = time.monotonic()
        polls = 0
        state = self.last
        while True:
            polls += 1
            try:
                state = self.state()
            except TransientApiError:
                pass
            else:
                if callback is not None:
                    callback(state)
                if state.capacity_reached:
                    return WaitResult(True, state, time.monotonic() - start, polls)
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                return WaitResult(False, state, elapsed, polls)
            time.sleep(max(0.0, min(poll, timeout - elapsed)))

    def delete(self) -> None:
        """Delete this cluster (see `Cloud.delete`)."""
        self.cloud.delete(self.id)
