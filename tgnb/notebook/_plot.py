"""Small self-contained SVG line plots for the RunPanel: a metric against the optimizer step, with
vertical markers at checkpoints, preemptions and resumes."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tgnb.markup import escape

#: Marker colours by kind (checkpoint, preemption, resume).
MARKER_COLOURS = {"checkpoint": "#3366cc", "preemption": "#d62728", "resume": "#1b9e77"}
#: Dash pattern by kind, so that markers read apart in grey print and side by side.
MARKER_DASHES = {"checkpoint": "1,2", "preemption": "4,2", "resume": "6,2,1,2"}
#: Pixels between markers that fall on the same step (a checkpoint on a preemption notice, and
#: the resume from it, share its step): drawn side by side, not one over the other.
MARKER_GAP = 3.0


def _fmt(v: float) -> str:
    if v == 0 or 1e-3 <= abs(v) < 1e4:
        return f"{v:.3g}"
    return f"{v:.2e}"


def nice_axis(lo: float, hi: float, ticks: int = 4) -> tuple[float, float, int]:
    """Round axis ends around [lo, hi] on a 1-2-2.5-5 step, and the decimals its labels need.

    A range too narrow to tell from its values (a GRPO loss of ±1e-8) is drawn around 0 or its
    value, so the axis reads ``0`` and not ``-1.86e-08``.
    """
    if hi - lo <= 1e-6 * max(1.0, abs(lo), abs(hi)):
        mid = (lo + hi) / 2
        mid = 0.0 if abs(mid) < 1e-6 else mid
        half = abs(mid) * 0.1 if mid else 0.5
        lo, hi = mid - half, mid + half
    raw = (hi - lo) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    step = next(k * mag for k in (1, 2, 2.5, 5, 10) if k * mag >= raw * (1 - 1e-9))
    lo_n, hi_n = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if step / mag == 2.5 else 0)
    return lo_n, hi_n, decimals


def _tick(v: float, decimals: int) -> str:
    if abs(v) >= 1e5 or decimals > 6:
        return _fmt(v)
    text = f"{v:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if float(text) == 0 else text


def axes(
    box: tuple[float, float, float, float],
    xs: tuple[float, float],
    ys: tuple[float, float],
    decimals: int,
    step_y: float,
) -> tuple[Callable[[float], float], Callable[[float], float], str]:
    """The scales and the drawn frame of a plot: `box` is (left, top, width, height) in pixels,
    `xs`/`ys` the data ranges (non-empty), `step_y` where the step labels sit."""
    left, top, w, h = box
    (x0, x1), (y0, y1) = xs, ys

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * h

    frame = (
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#999"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#999"/>'
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_tick(y1, decimals)}</text>'
        f'<text x="{left - 4}" y="{top + h}" text-anchor="end">{_tick(y0, decimals)}</text>'
        f'<text x="{left}" y="{step_y}">step {_fmt(x0)}</text>'
        f'<text x="{left + w}" y="{step_y}" text-anchor="end">{_fmt(x1)}</text>'
    )
    return sx, sy, frame


def curve_svg(
    title: str,
    points: Sequence[tuple[float, float]],
    markers: Sequence[tuple[float, str]] = (),
    width: int = 360,
    height: int = 150,
    colour: str = "#1f77b4",
    max_points: int = 600,
) -> str:
    """An ``<svg>`` of `points` (step, value) with `markers` (step, kind) as vertical lines.

    More than `max_points` points are thinned to every k-th point (the last one kept).
    """
    pts = [(x, y) for x, y in points if isinstance(y, (int, float)) and math.isfinite(y)]
    if len(pts) > max_points:
        k = math.ceil(len(pts) / max_points)
        pts = pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])
    left, right, top, bottom = 46, 10, 20, 22
    w, h = width - left - right, height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tgnb-curve" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="13" font-size="12" font-weight="bold">{escape(title)}</text>',
    ]
    if not pts:
        out.append(f'<text x="{left}" y="{top + h / 2:.0f}" fill="#888">no data yet</text></svg>')
        return "".join(out)
    xs = [p[0] for p in pts] + [m[0] for m in markers]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    y0, y1, decimals = nice_axis(y0, y1)

    sx, sy, frame = axes((left, top, w, h), (x0, x1), (y0, y1), decimals, height - 6)
    out.append(frame)
    order = {"checkpoint": 0, "preemption": 1, "resume": 2}  # as they happen at one step
    at: dict[float, list[str]] = {}
    for step, kind in sorted(set(markers), key=lambda m: (m[0], order.get(m[1], 3))):
        at.setdefault(step, []).append(kind)
    for step, kinds_here in at.items():
        together = ", ".join(kinds_here)
        for i, kind in enumerate(kinds_here):
            x = sx(step) + (i - (len(kinds_here) - 1) / 2) * MARKER_GAP
            out.append(
                f'<line class="mark {kind}" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" '
                f'stroke="{MARKER_COLOURS.get(kind, "#888")}" stroke-width="1.5" '
                f'stroke-dasharray="{MARKER_DASHES.get(kind, "3,2")}">'
                f"<title>{together} at step {_fmt(step)}</title></line>"
            )
    kinds = sorted({k for _, k in markers}, key=lambda k: order.get(k, 3))
    lx = width - right
    for kind in reversed(kinds):
        out.append(
            f'<text x="{lx}" y="13" text-anchor="end" fill="{MARKER_COLOURS.get(kind, "#888")}">'
            f"¦ {kind}</text>"
        )
        lx -= 8 + 6 * len(kind)
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    out.append(
        f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
    )
    out.append("</svg>")
    return "".join(out)
