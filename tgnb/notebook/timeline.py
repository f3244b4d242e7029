"""The preemption timeline: nodes, drain windows and runs on one time axis.

`EventTimeline` takes `tgnb.events.Event` records (node lifecycle events from the cluster and
lifecycle events from runs) and draws one lane per node (standard and preemptible nodes told apart by
the ``gpu-preemptible-dp`` name prefix), each node's lifetime (added -> preempted / scaled down, or
now), each preemption notice with its drain window shaded (notice -> removal, or notice + the drain
window while the removal is not seen yet), and one lane per run with its segments on nodes and
markers for start, checkpoints, signals, drain notices, requeues, resumes and exit. Post-Training
events (``source="posttraining"``) add one lane per model resource (provisioning, then READY until
stopped) and one per training session (running until stopped, expired or failed, with checkpoints).

The rendering is a self-contained SVG string (`to_svg`, `_repr_svg_`, `_repr_html_`) so papermill and
nbconvert outputs show it without a kernel. Markers that fall on the same few pixels of a lane are
merged into one (its tooltip gives the count), and node lanes beyond `max_lanes` are summed up in one
line, so 10,000 events draw in a few milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone, tzinfo
from typing import Any, Protocol, runtime_checkable

from tgnb import events as ev
from tgnb.events import Event, utcnow
from tgnb.notebook._lanes import LABEL, Lane, Marker, Span
from tgnb.prices import PREEMPTIBLE_PREFIX, node_class

#: The platform's drain window: a node is removed 300 s after its preemption notice.
DRAIN_WINDOW_S = 300.0

_NODE_END = {ev.PREEMPTED, ev.SCALED_DOWN}
_RUN_OPEN = {ev.RUN_STARTED, ev.RUN_RESUMED}
#: Run events another source records (a backend): drawn on the run's lane, not a node's.
_ON_RUN_LANE = (
    ev.RUN_REASONS
    | ev.GROUP_REASONS
    | {
        ev.RECOVERY_DECIDED,
        ev.RUN_FAILED_RESTARTING,
        ev.BUDGET_NOTICE,
        ev.BUDGET_REACHED,
    }
)
_RUN_CLOSE = {ev.RUN_REQUEUED, ev.RUN_EXITED}


_PT_OPEN = {
    ev.RESOURCE_CREATED: "provisioning",
    ev.RESOURCE_READY: "resource",
    ev.SESSION_STARTED: "session",
}
_PT_CLOSE = {
    ev.RESOURCE_STOPPED,
    ev.RESOURCE_ERROR,
    ev.SESSION_STOPPED,
    ev.SESSION_EXPIRED,
    ev.SESSION_ERROR,
}


def _as_event(item: Event | Mapping[str, Any]) -> Event:
    return item if isinstance(item, Event) else Event.from_dict(item)


def zone(tz: str | tzinfo | None) -> tzinfo:
    if tz is None or tz == "UTC":
        return timezone.utc
    if isinstance(tz, tzinfo):
        return tz
    from zoneinfo import ZoneInfo

    return ZoneInfo(tz)


class EventTimeline:
    """Nodes, drain windows and runs of a cluster drawn on one time axis.

    `events`: `Event`s or their dicts, in any order. `now`: where open lifetimes end (default: the
    current time). `tz`: the time zone of the axis labels (an IANA name or a tzinfo). `drain_window`:
    seconds from a preemption notice to the node's removal, used while the removal is not seen yet.
    """

    def __init__(
        self,
        events: Iterable[Event | Mapping[str, Any]],
        *,
        now: datetime | None = None,
        tz: str | tzinfo | None = "UTC",
        drain_window: float = DRAIN_WINDOW_S,
        width: int = 900,
        max_lanes: int = 40,
        title: str | None = None,
        fit_runs: bool = False,
    ) -> None:
        self.events = sorted((_as_event(e) for e in events), key=lambda e: e.time)
        self.now = (now or utcnow()).timestamp()
        self.tz = zone(tz)
        self.drain_window = float(drain_window)
        self.width = int(width)
        self.max_lanes = int(max_lanes)
        self.title = title
        #: the axis spans the runs' lanes only (a run's timeline), node lanes clipped to it: a node
        #: made an hour before the run would otherwise squeeze the run into the right edge
        self.fit_runs = bool(fit_runs)
        self.lanes, self.hidden = self._build()

    # -- model ---------------------------------------------------------------------------------
    def _build(self) -> tuple[list[Lane], dict[str, int]]:
        nodes: dict[str, Lane] = {}
        runs: dict[str, Lane] = {}
        cluster = Lane("cluster", "cluster")
        t0 = self.events[0].time.timestamp() if self.events else self.now
        alive: dict[str, float] = {}
        notice: dict[str, float] = {}
        running: dict[str, tuple[float, str | None]] = {}
        pt: dict[str, Lane] = {}
        pt_open: dict[str, tuple[float, str]] = {}

        def node_lane(name: str) -> Lane:
            lane = nodes.get(name)
            if lane is None:
                lane = nodes[name] = Lane(name, node_class(name))
            return lane

        for e in self.events:
            t = e.time.timestamp()
            if e.source == "posttraining":
                self._pt_event(e, t, pt, pt_open)
                continue
            if e.source == "run" or (e.run is not None and e.reason in _ON_RUN_LANE):
                name = e.run or "run"
                lane = runs.get(name) or runs.setdefault(name, Lane(name, "run"))
                if e.reason in _RUN_OPEN or e.reason in _RUN_CLOSE:
                    if name in running:
                        self._close_run(lane, node_lane, running.pop(name), t, False)
                    if e.reason in _RUN_OPEN:
                        running[name] = (t, e.node)
                lane.markers.append(Marker(t, e.reason, _describe(e)))
                if e.node:
                    node_lane(e.node)
                continue
            if e.node is None:
                cluster.markers.append(Marker(t, e.reason, _describe(e)))
                continue
            lane = node_lane(e.node)
            if e.node not in alive and not any(s.kind == lane.kind for s in lane.spans):
                # The node existed before the first event we see about it.
                alive[e.node] = t if e.reason == ev.NODE_ADDED else t0
            if e.reason == ev.PREEMPTION_NOTIFIED:
                notice.setdefault(e.node, t)
                lane.markers.append(Marker(t, e.reason, _describe(e)))
            elif e.reason in _NODE_END:
                if e.node in notice:
                    lane.spans.append(Span(notice.pop(e.node), t, "drain", "drain window"))
                if e.node in alive:
                    start = alive.pop(e.node)
                    lane.spans.append(Span(start, t, lane.kind, LABEL.get(e.reason, e.reason)))
            elif e.reason == ev.NODE_ADDED:
                alive.setdefault(e.node, t)
            else:
                lane.markers.append(Marker(t, e.reason, _describe(e)))

        for name, start in alive.items():
            nodes[name].spans.append(Span(start, max(self.now, start), nodes[name].kind, "", True))
        for name, t in notice.items():
            nodes[name].spans.append(
                Span(t, t + self.drain_window, "drain", "drain window (removal not seen yet)", True)
            )
        for name, seg in running.items():
            self._close_run(runs[name], node_lane, seg, max(self.now, seg[0]), True)
        for key, (start, kind) in pt_open.items():
            pt[key].spans.append(Span(start, max(self.now, start), kind, kind, True))

        kept = list(nodes.values())
        hidden: dict[str, int] = {}
        if len(kept) > self.max_lanes:
            # Keep the nodes runs ran on, then the most recently active ones.
            kept.sort(
                key=lambda ln: (
                    not any(s.kind == "occupied" for s in ln.spans),
                    -max((s.end for s in ln.spans), default=0),
                )
            )
            for lane in kept[self.max_lanes :]:
                hidden[lane.kind] = hidden.get(lane.kind, 0) + 1
            kept = kept[: self.max_lanes]
        ordered = sorted(
            kept,
            key=lambda ln: (
                ln.kind != "standard",
                min((s.start for s in ln.spans), default=0),
                _natural(ln.key),
            ),
        )
        run_lanes = sorted(
            runs.values(),
            key=lambda ln: (min((s.start for s in ln.spans), default=self.now), _natural(ln.key)),
        )
        lanes = ([cluster] if cluster.markers else []) + ordered + run_lanes + list(pt.values())
        return lanes, hidden

    @staticmethod
    def _pt_event(
        e: Event, t: float, lanes: dict[str, Lane], opened: dict[str, tuple[float, str]]
    ) -> None:
        """A Post-Training event: one lane per model resource (provisioning, then READY), one per
        training session (its run, its checkpoints); a session's lane follows its resource's."""
        data = e.data or {}
        session = data.get("session")
        key = str(session or data.get("resource") or e.run or "post-training")
        if key not in lanes:
            name = data.get("name")
            label = f"{name} · {key[-6:]}" if name else key
            lanes[key] = Lane(label, "session" if session else "resource")
        lane = lanes[key]
        if e.reason in _PT_OPEN or e.reason in _PT_CLOSE:
            if key in opened:
                start, kind = opened.pop(key)
                lane.spans.append(Span(start, t, kind, LABEL.get(e.reason, e.reason)))
            if e.reason in _PT_OPEN:
                opened[key] = (t, _PT_OPEN[e.reason])
        lane.markers.append(Marker(t, e.reason, _describe(e)))

    @staticmethod
    def _close_run(
        lane: Lane, node_lane: Any, seg: tuple[float, str | None], end: float, is_open: bool
    ) -> None:
        start, node = seg
        label = f"on {node}" if node else ""
        lane.spans.append(Span(start, end, "run", label, is_open))
        if node:
            node_lane(node).spans.append(Span(start, end, "occupied", lane.key, is_open))

    # -- summary -------------------------------------------------------------------------------
    @property
    def preemptions(self) -> int:
        return sum(1 for e in self.events if e.reason == ev.PREEMPTION_NOTIFIED)

    def __repr__(self) -> str:
        n_nodes = sum(1 for ln in self.lanes if ln.kind in ("standard", "preemptible"))
        n_nodes += sum(self.hidden.values())
        n_runs = sum(1 for ln in self.lanes if ln.kind == "run")
        counts = [(len(self.events), "event"), (n_nodes, "node"), (n_runs, "run")]
        counts.append((self.preemptions, "preemption"))
        return (
            "EventTimeline(" + ", ".join(f"{n} {w}{'' if n == 1 else 's'}" for n, w in counts) + ")"
        )

    # -- rendering -----------------------------------------------------------------------------
    def bounds(self) -> tuple[float, float]:
        """The first and last instants on the axis (POSIX seconds). Fitted to the runs, the
        axis still reaches the end of a drain window that began on it (the node's removal may
        come after the run has finished elsewhere)."""
        shown = self.lanes
        if self.fit_runs and any(ln.kind == "run" and (ln.spans or ln.markers) for ln in shown):
            shown = [ln for ln in shown if ln.kind == "run"]
        starts = [s.start for ln in shown for s in ln.spans]
        starts += [m.time for ln in shown for m in ln.markers]
        ends = [s.end for ln in shown for s in ln.spans] + starts
        lo = min(starts, default=self.now - 60)
        hi = max([*ends, lo + 1.0])
        drains = [s for ln in self.lanes for s in ln.spans if s.kind == "drain"]
        hi = max([hi, *(s.end for s in drains if lo <= s.start <= hi)])
        return lo, hi

    def to_svg(self) -> str:
        """The timeline as one self-contained ``<svg>`` element."""
        from tgnb.notebook._svg import render

        return render(self)

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def _repr_html_(self) -> str:
        return f'<div class="tgnb-timeline" style="overflow-x:auto">{self.to_svg()}</div>'

    def save(self, path: str) -> None:
        """Write the SVG (or, for a ``.html`` path, a small HTML page) to `path`."""
        text = self.to_svg()
        if str(path).endswith((".html", ".htm")):
            text = f"<!doctype html><meta charset='utf-8'>{self._repr_html_()}"
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)

    def format_time(self, t: float) -> str:
        """`t` (POSIX seconds) as a date and time in the display time zone."""
        return datetime.fromtimestamp(t, self.tz).strftime("%Y-%m-%d %H:%M:%S %Z")

    def short_time(self, t: float) -> str:
        """`t` as a time of day in the display time zone."""
        return datetime.fromtimestamp(t, self.tz).strftime("%H:%M:%S")


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key that puts ``dp-2`` before ``dp-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _describe(e: Event) -> str:
    parts = [LABEL.get(e.reason, e.reason)]
    if e.source == "posttraining" and e.data and e.data.get("name"):
        parts.append(str(e.data["name"]))
    if e.run:
        parts.append(e.run)
    if e.node:
        parts.append(f"on {e.node}")
    step = e.data.get("step") if e.data else None
    if step is not None:
        parts.append(f"step {step}")
    if e.message:
        parts.append(e.message)
    return " · ".join(str(p) for p in parts)  # plain text: the renderer escapes it


@runtime_checkable
class EventSource(Protocol):
    """What has events of its own: a `Session`, a `Run`, a Post-Training `Resource`."""

    def events(self) -> Sequence[Event]: ...


def timeline(
    events: Iterable[Event | Mapping[str, Any]] | EventSource, **options: Any
) -> EventTimeline:
    """Build an `EventTimeline` from events, or from an `EventSource` (a Session, a Run, a
    Post-Training resource). A Run's timeline is fitted to the run (``fit_runs``): the nodes it
    ran on are drawn over the run's time, not from their creation."""
    if isinstance(events, EventSource):
        from tgnb.runs import Run

        if isinstance(events, Run):  # a run's timeline: the axis fitted to the run
            options.setdefault("fit_runs", True)
        events = events.events()
    return EventTimeline(events, **options)


__all__ = [
    "DRAIN_WINDOW_S",
    "PREEMPTIBLE_PREFIX",
    "EventSource",
    "EventTimeline",
    "Lane",
    "Marker",
    "Span",
    "node_class",
    "timeline",
]
