"""SVG drawing of an `EventTimeline`: lanes, spans, merged markers, a time axis and a legend.

Spans closer than a pixel are merged and markers of one kind within `_BUCKET_PX` pixels of a lane
are drawn once with a count, so the element count is bounded by lanes x width, not by events.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from tgnb import events as ev
from tgnb.markup import escape
from tgnb.notebook._lanes import (
    LABEL,
    MARKER_STYLE,
    OTHER,
    OTHER_LABEL,
    OTHER_STYLE,
    SPAN_STYLE,
    Marker,
    Span,
)

if TYPE_CHECKING:
    from tgnb.notebook.timeline import EventTimeline

_LEFT = 200
_RIGHT = 24
_LANE_H = 18
_GAP = 4
_BUCKET_PX = 3.0
#: At most about this many marker elements in one drawing (buckets widen to fit).
_MARKER_BUDGET = 2500
#: Drawing order of span kinds: lifetimes under runs under drain windows.
_ORDER = {"standard": 0, "preemptible": 0, "run": 0, "occupied": 1, "drain": 2}
_STEPS: tuple[int, ...] = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)
_STEPS += tuple(86400 * k for k in (2, 7, 14, 30))


def _merge_spans(spans: list[Span], scale: float) -> list[Span]:
    """Join spans of the same kind that touch or are less than a pixel apart."""
    out: list[Span] = []
    last: dict[str, int] = {}
    for s in sorted(spans, key=lambda s: (_ORDER.get(s.kind, 9), s.start)):
        i = last.get(s.kind)
        prev = out[i] if i is not None else None
        if i is not None and prev is not None and (s.start - prev.end) * scale < 1.0:
            label = prev.label
            if s.label and s.label != prev.label and not label.endswith("(+ more)"):
                label = f"{label} (+ more)"
            out[i] = Span(prev.start, max(prev.end, s.end), s.kind, label, prev.open or s.open)
        else:
            last[s.kind] = len(out)
            out.append(s)
    return out


def _bucket_markers(
    markers: list[Marker], x_of: Callable[[float], float], px: float
) -> list[tuple[float, Marker]]:
    """One marker per (reason, `px`-wide pixel bucket); the first one's label, the sum of counts.
    A checkpoint interval is never merged with another: each tells a different interval (an
    attempt's first, from a guessed stall, and the one measured a few seconds later would
    otherwise be one marker saying only the first); a few at one spot are grouped by `_groups`,
    each named in the tooltip."""
    buckets: dict[tuple[str, int, str], tuple[float, Marker]] = {}
    for m in markers:
        x = x_of(m.time)
        key = (m.reason, int(x // px), m.label if m.reason == ev.CHECKPOINT_INTERVAL else "")
        got = buckets.get(key)
        if got is None:
            buckets[key] = (x, Marker(m.time, m.reason, m.label, m.count))
        else:
            got[1].count += m.count
    return list(buckets.values())


def _all_markers(
    tl: EventTimeline, x_of: Callable[[float], float]
) -> list[list[tuple[float, Marker]]]:
    """Bucketed markers of every lane; buckets widen until the total fits `_MARKER_BUDGET`."""
    px = _BUCKET_PX
    while True:
        lanes = [_bucket_markers(lane.markers, x_of, px) for lane in tl.lanes]
        if sum(len(b) for b in lanes) <= _MARKER_BUDGET or px >= 48:
            return lanes
        px *= 2


#: Lane labels up to this many characters are shown whole (the left margin holds about 32).
_LABEL_CHARS = 31
#: Horizontal room of one marker (pixels): markers closer than this on a lane are set apart.
_MARKER_W = 10.0


def _lane_label(key: str) -> str:
    """A lane's label: the whole name when it fits, else its first and last dash-separated parts
    around an ellipsis (``gpu-…-dp-daacfafa-0``), never cut inside a part that is kept."""
    if len(key) <= _LABEL_CHARS:
        return key
    parts = key.split("-")
    head, tail = parts[0], parts[1:]
    kept: list[str] = []
    while tail and len(head) + 3 + len("-".join([tail[-1], *kept])) <= _LABEL_CHARS:
        kept.insert(0, tail.pop())
    if not kept:  # no dashes to cut at: keep both ends
        return key[:12] + "…" + key[-(_LABEL_CHARS - 13) :]
    return f"{head}-…-{'-'.join(kept)}"


def _dodge(placed: list[tuple[float, Marker]]) -> list[tuple[float, Marker]]:
    """Markers (sorted by x) moved right just enough not to overlap the previous one on their
    lane (events a second apart: signal, checkpoint, exit), by at most three markers' width."""
    out: list[tuple[float, Marker]] = []
    last = float("-inf")
    for x, m in placed:
        drawn = min(max(x, last + _MARKER_W), x + 3 * _MARKER_W)
        out.append((drawn, m))
        last = drawn
    return out


#: Markers of one lane within this many pixels of a group's first are one group: up to
#: `_GROUP_MAX` are set side by side (`_dodge`), more are drawn as one marker with their count.
_GROUP_PX = 3 * _MARKER_W
_GROUP_MAX = 3


def _groups(placed: list[tuple[float, Marker]]) -> list[list[tuple[float, Marker]]]:
    """Markers (sorted by x) in groups that would overlap when drawn."""
    out: list[list[tuple[float, Marker]]] = []
    for x, m in placed:
        if out and x - out[-1][0][0] < _GROUP_PX:
            out[-1].append((x, m))
        else:
            out.append([(x, m)])
    return out


def _group_svg(group: list[tuple[float, Marker]], mid: float, when: Callable[[float], str]) -> str:
    """A few markers side by side, or many (a signal, a checkpoint, the requeue and the resume
    within a second) as the first one with a count, every event named in its tooltip."""

    def title(m: Marker) -> str:
        count = f" ×{m.count}" if m.count > 1 else ""
        return f"{escape(m.label)}{count} at {escape(when(m.time))}"

    def use(x: float, m: Marker, tip: str) -> str:
        ref = _symbol_of(m.reason)
        return (
            f'<use class="marker {escape(m.reason)}" xlink:href="#tgnb-m-{ref}" x="{x:.1f}" '
            f'y="{mid:.1f}"><title>{tip}</title></use>'
        )

    if len(group) <= _GROUP_MAX:
        return "".join(use(x, m, title(m)) for x, m in _dodge(group))
    x, first = group[0]
    total = sum(m.count for _, m in group)
    tip = "&#10;".join(title(m) for _, m in group)
    return (
        f'<g class="marker-group" data-count="{total}">{use(x, first, tip)}'
        f'<text class="marker-count" x="{x + 7:.1f}" y="{mid - 5:.1f}" font-size="9" '
        f'font-weight="bold" fill="#333">×{total}<title>{tip}</title></text></g>'
    )


def _ticks(lo: float, hi: float, target: int) -> tuple[list[float], int]:
    span = max(hi - lo, 1.0)
    step = next((s for s in _STEPS if span / s <= target), _STEPS[-1])
    first = (int(lo) // step + 1) * step
    return [float(t) for t in range(int(first), int(hi) + 1, step)], step


def _shape(kind: str, x: float, y: float, color: str, r: float = 4.5) -> str:
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r - 1:.1f}" fill="{color}"/>'
    if kind == "square":
        return f'<rect x="{x - r + 1:.1f}" y="{y - r + 1:.1f}" width="{2 * r - 2:.1f}" height="{2 * r - 2:.1f}" fill="{color}"/>'
    if kind == "bar":
        return f'<rect x="{x - 1:.1f}" y="{y - r - 2:.1f}" width="2.5" height="{2 * r + 4:.1f}" fill="{color}"/>'
    if kind == "cross":
        d = r - 0.5
        return (
            f'<path d="M{x - d:.1f},{y - d:.1f}L{x + d:.1f},{y + d:.1f}M{x - d:.1f},{y + d:.1f}'
            f'L{x + d:.1f},{y - d:.1f}" stroke="{color}" stroke-width="2.5" fill="none"/>'
        )
    if kind == "ring":
        return (
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r - 1.5:.1f}" fill="white" '
            f'stroke="{color}" stroke-width="1.5"/>'
        )
    if kind == "diamond":
        pts = f"{x:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r:.1f} {x - r:.1f},{y:.1f}"
        return f'<polygon points="{pts}" fill="{color}"/>'
    dy = -r if kind == "up" else r
    pts = f"{x - r:.1f},{y - dy:.1f} {x + r:.1f},{y - dy:.1f} {x:.1f},{y + dy:.1f}"
    return f'<polygon points="{pts}" fill="{color}"/>'


_RECOVERY = (ev.RECOVERY_DECIDED, ev.RUN_FAILED_RESTARTING)
_LEGEND = (
    ev.RUN_STARTED,
    ev.CHECKPOINT_SAVED,
    ev.CHECKPOINT_INTERVAL,
    ev.PREEMPTION_NOTIFIED,
    ev.SIGNAL_RECEIVED,
    ev.DRAIN_NOTICE,
    ev.RUN_REQUEUED,
    ev.RUN_RESUMED,
    ev.RUN_EXITED,
    ev.TARGET_CHANGED,
)


#: The legend's entry for a group of markers drawn as one with a count (`_group_svg`).
COUNT_LABEL = "×N: N events at one moment (hover for each)"


def _symbol_of(reason: str) -> str:
    """The symbol (``tgnb-m-<this>``) a marker of `reason` is drawn with."""
    return reason if reason in MARKER_STYLE else OTHER


def _style_of(symbol: str) -> tuple[str, str]:
    return MARKER_STYLE.get(symbol, OTHER_STYLE)


def _marker_legend(tl: EventTimeline, grouped: bool) -> list[tuple[str, str]]:
    """What the legend explains, as (symbol, label): one entry per symbol the timeline draws
    (every marker drawn has one; kinds drawn alike share it, their labels joined), the usual ones
    first, and the ``×N`` count when some markers were drawn as one (`grouped`)."""
    shown = {_symbol_of(m.reason) for ln in tl.lanes for m in ln.markers}
    order = [*_LEGEND, *_RECOVERY, *(r for r in MARKER_STYLE if r not in _LEGEND), OTHER]
    labels: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for symbol in dict.fromkeys(order):
        if symbol in shown:
            label = LABEL.get(symbol, OTHER_LABEL)
            _, names = labels.setdefault(_style_of(symbol), (symbol, []))
            if label not in names:
                names.append(label)
    out = [(symbol, " / ".join(names)) for symbol, names in labels.values()]
    return [*out, ("count", COUNT_LABEL)] if grouped else out


def _legend_lines(labels: list[str], width: int) -> int:
    lines, x = 1, 8.0
    for label in labels:
        w = 22 + 6.5 * len(label)
        if x + w > width and x > 8.0:
            lines, x = lines + 1, 8.0
        x += w
    return lines


def _symbols() -> str:
    """One ``<g id="tgnb-m-REASON">`` per marker kind, drawn at the origin and placed by ``<use>``."""
    return "".join(
        f'<g id="tgnb-m-{reason}">{_shape(shape, 0, 0, color)}</g>'
        for reason, (shape, color) in [*MARKER_STYLE.items(), (OTHER, OTHER_STYLE)]
    )


def render(tl: EventTimeline) -> str:
    lo, hi = tl.bounds()
    pad = (hi - lo) * 0.02
    lo, hi = lo - pad, hi + pad
    plot_w = max(tl.width - _LEFT - _RIGHT, 100)
    scale = plot_w / (hi - lo)

    def x_of(t: float) -> float:
        return _LEFT + (t - lo) * scale

    def inside(t: float) -> float:  # spans that begin before the window start at its edge
        return min(max(t, lo), hi)

    top = 46 if tl.title else 30
    lanes = tl.lanes
    n_rows = len(lanes) + (1 if tl.hidden else 0)
    plot_h = n_rows * (_LANE_H + _GAP)
    when = tl.short_time if hi - lo < 86400 else tl.format_time
    bucketed = _all_markers(tl, x_of)
    placed_by_lane = [
        sorted((p for p in bucketed[i] if lo <= p[1].time <= hi), key=lambda p: p[0])
        for i in range(len(lanes))
    ]
    groups_by_lane = [_groups(placed) for placed in placed_by_lane]
    grouped = any(len(g) > _GROUP_MAX for groups in groups_by_lane for g in groups)
    marker_legend = _marker_legend(tl, grouped)
    legend_lines = _legend_lines([label for _, label in marker_legend], tl.width)
    height = top + plot_h + 60 + 18 * (legend_lines - 1)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        f'class="tgnb-timeline" width="{tl.width}" '
        f'height="{height}" viewBox="0 0 {tl.width} {height}" '
        'font-family="sans-serif" font-size="11">',
        '<defs><pattern id="tgnb-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#d62728" fill-opacity="0.25"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#d62728" stroke-width="2"/></pattern>'
        f"{_symbols()}</defs>",
        f'<rect width="{tl.width}" height="{height}" fill="white"/>',
    ]
    if tl.title:
        out.append(
            f'<text x="8" y="18" font-size="14" font-weight="bold">{escape(tl.title)}</text>'
        )

    # Time axis: grid lines and labels in the display time zone.
    ticks, step = _ticks(lo, hi, max(3, plot_w // 110))
    fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%m-%d"
    if step < 86400 and hi - lo > 86400:
        fmt = "%m-%d %H:%M"
    tzname = datetime.fromtimestamp(lo, tl.tz).strftime("%Z") or str(tl.tz)
    out.append(f'<text x="8" y="{top - 8}" fill="#555">time ({escape(tzname)})</text>')
    for t in ticks:
        x = x_of(t)
        label = datetime.fromtimestamp(t, tl.tz).strftime(fmt)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#e5e5e5"/>'
            f'<text x="{x:.1f}" y="{top - 8}" text-anchor="middle" fill="#555">{escape(label)}</text>'
        )

    for i, lane in enumerate(lanes):
        y_lane: float = top + i * (_LANE_H + _GAP)
        mid = y_lane + _LANE_H / 2
        name = _lane_label(lane.key)
        tag = {"standard": "standard node", "preemptible": "preemptible node"}.get(
            lane.kind, lane.kind
        )
        swatch = SPAN_STYLE.get(lane.kind, "#7570b3")
        out.append(
            f'<g class="lane lane-{escape(lane.kind)}" data-key="{escape(lane.key)}">'
            f'<rect x="6" y="{mid - 5:.1f}" width="10" height="10" fill="{swatch}"><title>{escape(tag)}</title></rect>'
            f'<text x="{_LEFT - 6}" y="{mid + 4:.1f}" text-anchor="end">{escape(name)}'
            f"<title>{escape(lane.key)}</title></text>"
        )
        for s in _merge_spans(lane.spans, scale):
            if s.end < lo or s.start > hi:
                continue
            x0, x1 = x_of(inside(s.start)), x_of(inside(s.end))
            w = max(x1 - x0, 1.0)
            h, yy = (_LANE_H, y_lane) if s.kind != "occupied" else (6, y_lane + _LANE_H - 6)
            opacity = (
                ' fill-opacity="0.55"' if s.open and s.kind in ("standard", "preemptible") else ""
            )
            title = escape(f"{s.label} {when(s.start)} → {when(s.end)}".strip())
            out.append(
                f'<rect class="span {escape(s.kind)}" x="{x0:.1f}" y="{yy:.1f}" width="{w:.1f}" height="{h}" '
                f'fill="{SPAN_STYLE[s.kind]}"{opacity}><title>{title}</title></rect>'
            )
        for group in groups_by_lane[i]:
            out.append(_group_svg(group, mid, when))
        out.append("</g>")
    if tl.hidden:
        y_more = top + len(lanes) * (_LANE_H + _GAP) + _LANE_H / 2 + 4
        more = ", ".join(f"{n} {kind}" for kind, n in sorted(tl.hidden.items()))
        out.append(
            f'<text class="hidden-lanes" x="8" y="{y_more:.1f}" fill="#888">+ {escape(more)} nodes not shown</text>'
        )

    if lo <= tl.now <= hi:
        x = x_of(tl.now)
        out.append(
            f'<line class="now" x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + plot_h}" '
            'stroke="#444" stroke-dasharray="3,3"><title>now</title></line>'
        )

    # Legend.
    y = top + plot_h + 22.0
    x = 8.0
    items: list[tuple[str, str]] = [
        ("standard", "standard node"),
        ("preemptible", "preemptible node"),
        ("drain", "drain window"),
        ("run", "run"),
    ]
    if any(ln.kind in ("resource", "session") for ln in lanes):
        items += [("resource", "model resource"), ("session", "training session")]
    for kind, label in items:
        out.append(
            f'<rect x="{x:.0f}" y="{y - 9}" width="14" height="10" fill="{SPAN_STYLE[kind]}"/>'
        )
        out.append(f'<text x="{x + 18:.0f}" y="{y}">{escape(label)}</text>')
        x += 24 + 7 * len(label)
    y += 18
    x = 8.0
    for reason, label in marker_legend:
        width = 22 + 6.5 * len(label)
        if x + width > tl.width and x > 8.0:  # wrap: the next line of the legend
            x, y = 8.0, y + 18
        if reason != "count":
            out.append(
                f'<use class="legend-symbol" xlink:href="#tgnb-m-{reason}" '
                f'x="{x + 5:.0f}" y="{y - 4}"/>'
            )
        out.append(f'<text class="legend-marker" x="{x + 14:.0f}" y="{y}">{escape(label)}</text>')
        x += width
    out.append("</svg>")
    return "".join(out)
