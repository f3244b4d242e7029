"""A self-contained SVG plot of several series on shared axes (one per training session), so
LoRA runs on one resource compare at a glance. Same look as `tgnb.notebook._plot.curve_svg`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tgnb.markup import escape
from tgnb.notebook._plot import axes, nice_axis

#: Series colours, in order (a colour-blind-safe palette).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def multi_curve_svg(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    width: int = 420,
    height: int = 180,
    max_points: int = 400,
) -> str:
    """An ``<svg>`` of each (step, value) series of `series` (label -> points), shared axes,
    with a legend; labels keep their order (and colour) across refreshes."""
    clean: dict[str, list[tuple[float, float]]] = {}
    for label, points in series.items():
        pts = [
            (float(x), float(y))
            for x, y in points
            if isinstance(y, (int, float)) and math.isfinite(y)
        ]
        if len(pts) > max_points:
            k = math.ceil(len(pts) / max_points)
            pts = pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])
        clean[label] = pts
    left, right, top, bottom = 46, 10, 20, 22
    legend_h = 14 * ((len(clean) + 2) // 3)
    height += legend_h
    w, h = width - left - right, height - top - bottom - legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tgnb-curves" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="13" font-size="12" font-weight="bold">{escape(title)}</text>',
    ]
    allp = [p for pts in clean.values() for p in pts]
    if not allp:
        out.append(f'<text x="{left}" y="{top + h / 2:.0f}" fill="#888">no data yet</text></svg>')
        return "".join(out)
    x0, x1 = min(p[0] for p in allp), max(p[0] for p in allp)
    y0, y1 = min(p[1] for p in allp), max(p[1] for p in allp)
    if x1 == x0:
        x1 = x0 + 1
    y0, y1, decimals = nice_axis(y0, y1)
    sx, sy, frame = axes((left, top, w, h), (x0, x1), (y0, y1), decimals, top + h + 14)
    out.append(frame)
    for i, (label, pts) in enumerate(clean.items()):
        c = colour(i)
        name = escape(label)
        if len(pts) == 1:
            x, y = pts[0]
            out.append(
                f'<circle class="series" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}">'
                f"<title>{name}</title></circle>"
            )
        elif pts:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(
                f'<polyline class="series" points="{path}" fill="none" stroke="{c}" '
                f'stroke-width="1.5"><title>{name}</title></polyline>'
            )
        lx = left + (i % 3) * (w / 3)
        ly = top + h + 30 + 14 * (i // 3)
        short = label if len(label) <= 22 else label[:10] + "…" + label[-10:]
        out.append(
            f'<rect x="{lx:.0f}" y="{ly - 8}" width="10" height="3" fill="{c}"/>'
            f'<text x="{lx + 14:.0f}" y="{ly - 4}">{escape(short)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


__all__ = ["PALETTE", "colour", "multi_curve_svg"]
