"""A sweep in the notebook: its table over one chart of every run's metric against the step, each
preemption a marker on its run's curve (`tgnb.runs.sweeps.Sweep`).

``%load_ext tgnb`` makes `sweep_html` the rendering of every `Sweep` a cell shows (IPython's
HTML formatter for the type, registered by its name, so nothing is imported until one is shown); ``%tg sweep NAME`` shows
the same `SweepView`. The server extension sends `chart_svg` to the sidebar. Every string drawn
goes through `tgnb.markup.escape`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tgnb.markup import escape
from tgnb.notebook._plot import axes, nice_axis
from tgnb.notebook._pt_plot import colour
from tgnb.runs.sweeps import best_run

if TYPE_CHECKING:
    from tgnb.runs.sweeps import Curve, Sweep, SweepRow

#: The marker of a preemption on a curve, and its legend's word.
PREEMPTION_MARK = "▼"


def _short(label: str) -> str:
    return label if len(label) <= 24 else label[:11] + "…" + label[-11:]


def _y_at(points: Sequence[tuple[int, float]], step: int) -> float | None:
    """The curve's value at `step`: the last point at or before it (the first point before any)."""
    before = [v for s, v in points if s <= step]
    return before[-1] if before else (points[0][1] if points else None)


def chart_svg(curves: Sequence[Curve], width: int = 560, height: int = 220) -> str:
    """An ``<svg>``: each run's metric against the step on shared axes, in the palette's colour of
    its place in the sweep, a ``▼`` where a preemption hit it (its tooltip names the run and the
    step), a legend naming each run with its state and preemptions."""
    metrics = sorted({c.metric for c in curves if c.metric and c.points})
    title = " / ".join(metrics) if metrics else "metric"
    left, right, top, bottom = 46, 10, 20, 22
    legend_h = 14 * ((len(curves) + 1) // 2) + 8  # under the step labels
    total_h = height + legend_h
    w, h = width - left - right, height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tgnb-sweep-chart" width="{width}" '
        f'height="{total_h}" font-family="sans-serif" font-size="10">',
        f'<rect width="{width}" height="{total_h}" fill="white"/>',
        f'<text x="{left}" y="13" font-size="12" font-weight="bold">{escape(title)} by step</text>',
    ]
    pts = [p for c in curves for p in c.points if math.isfinite(p[1])]
    if not pts:
        out.append(f'<text x="{left}" y="{top + h / 2:.0f}" fill="#888">no metrics yet</text>')
    else:
        steps = [p[0] for p in pts] + [s for c in curves for s in c.preemptions]
        x0, x1 = min(steps), max(steps)
        x1 = x1 if x1 > x0 else x0 + 1
        y0, y1, decimals = nice_axis(min(p[1] for p in pts), max(p[1] for p in pts))
        sx, sy, frame = axes((left, top, w, h), (x0, x1), (y0, y1), decimals, top + h + 14)
        out.append(frame)
        for i, c in enumerate(curves):
            name = escape(c.run)
            if len(c.points) == 1:
                ((x, y),) = c.points
                out.append(
                    f'<circle class="series" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" '
                    f'fill="{colour(i)}"><title>{name}</title></circle>'
                )
            elif c.points:
                path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in c.points)
                out.append(
                    f'<polyline class="series" points="{path}" fill="none" stroke="{colour(i)}" '
                    f'stroke-width="1.5"><title>{name}</title></polyline>'
                )
            for step in c.preemptions:
                at = _y_at(c.points, step)
                cy = sy(at) - 4 if at is not None else top + 6
                out.append(
                    f'<text class="preemption" x="{sx(step):.1f}" y="{cy:.1f}" '
                    f'text-anchor="middle" fill="{colour(i)}" font-size="11">{PREEMPTION_MARK}'
                    f"<title>{name}: preempted at step {step}</title></text>"
                )
    for i, c in enumerate(curves):
        lx = left + (i % 2) * (w / 2)
        ly = height + 14 * (i // 2) + 14
        n = len(c.preemptions)
        said = f"{_short(c.run)} · {c.state}" + (f" · {n} {PREEMPTION_MARK}" if n else "")
        out.append(
            f'<rect x="{lx:.0f}" y="{ly - 8}" width="10" height="3" fill="{colour(i)}"/>'
            f'<text class="legend" x="{lx + 14:.0f}" y="{ly - 4}">{escape(said)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def table_html(rows: Sequence[SweepRow], best: str | None) -> str:
    """The sweep's table: a row per run, the best run's marked ``★``."""
    from tgnb.notebook.tables import NO_BREAK
    from tgnb.runs.sweeps import HEAD

    if not rows:
        return "<div>no runs in this sweep yet</div>"
    head = "".join(f"<th>{escape(h.lower())}</th>" for h in HEAD)
    body = []
    for r in rows:
        cells = list(r.cells())
        if r.run == best:
            cells[-1] = f"★ {cells[-1]}"
        tds = "".join(f"<td>{escape(v)}</td>" for v in cells)
        body.append(f"<tr data-run='{escape(r.run)}'>{tds}</tr>")
    return (
        f"<table class='tgnb-table' style='{NO_BREAK}'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


class SweepView:
    """What a cell shows of a sweep: its headline, table and chart (read once, when built)."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.rows = sweep.rows()
        self.headline = sweep.headline(self.rows)
        self.curves = sweep.curves()
        self.best = best_run(self.rows, sweep.mode)

    def __str__(self) -> str:
        return self.sweep.table_text(self.rows)

    __repr__ = __str__

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        name = self.sweep.name
        stop = (
            f"stop every run: <code>{escape(f'session.sweep({name!r}).stop()')}</code> or "
            f"<code>{escape(f'%tg sweep {name} --stop')}</code>"
        )
        return (
            f"<div class='tgnb-sweep'><b>{escape(self.headline)}</b>"
            f"{table_html(self.rows, self.best)}<div>{chart_svg(self.curves)}</div>"
            f"<div style='color:#555'>{stop}</div></div>"
        )


def sweep_html(sweep: Sweep) -> str:
    """A sweep as a cell shows it once ``%load_ext tgnb`` ran: table and chart."""
    return SweepView(sweep)._repr_html_()


__all__ = ["SweepView", "chart_svg", "sweep_html", "table_html"]
