"""GPU-hours of runs on standard and preemptible nodes, and the work lost to preemptions.

Computed from each run's lifecycle events: a run holds its GPUs from ``RunStarted``/``RunResumed``
until ``RunRequeued``/``RunExited`` (or now), on the node the event names. Work lost to a
preemption is the time trained after the last checkpoint of a stretch that ended in a requeue: it is
redone after the resume. Prices are per GPU-hour and optional.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tgnb import events as ev
from tgnb.events import Event, utcnow
from tgnb.markup import escape
from tgnb.notebook.timeline import node_class
from tgnb.runs.spec import EXIT_PREEMPTED


@dataclass
class RunCost:
    """One run's GPU-hours by node class, and what preemptions cost it."""

    run: str
    gpus: int
    standard_gpu_hours: float = 0.0
    preemptible_gpu_hours: float = 0.0
    preemptions: int = 0
    lost_gpu_hours: float = 0.0
    lost_steps: int = 0


@dataclass
class CostReport:
    """GPU-hours of a session's runs; prices in currency units per GPU-hour (None: not shown)."""

    runs: list[RunCost] = field(default_factory=list)
    standard_price: float | None = None
    preemptible_price: float | None = None
    #: which runs these are (``%tg cost``: this notebook's, or the cluster's with --all)
    scope: str = ""

    def total(self, attr: str) -> float:
        return float(sum(getattr(r, attr) for r in self.runs))

    @property
    def cost(self) -> float | None:
        if self.standard_price is None or self.preemptible_price is None:
            return None
        return (
            self.total("standard_gpu_hours") * self.standard_price
            + self.total("preemptible_gpu_hours") * self.preemptible_price
        )

    def _rows(self) -> list[list[str]]:
        rows = [
            [
                r.run,
                str(r.gpus),
                f"{r.standard_gpu_hours:.3f}",
                f"{r.preemptible_gpu_hours:.3f}",
                str(r.preemptions),
                f"{r.lost_gpu_hours:.3f}",
                str(r.lost_steps),
            ]
            for r in self.runs
        ]
        rows.append(
            [
                "total",
                "",
                f"{self.total('standard_gpu_hours'):.3f}",
                f"{self.total('preemptible_gpu_hours'):.3f}",
                str(int(self.total("preemptions"))),
                f"{self.total('lost_gpu_hours'):.3f}",
                str(int(self.total("lost_steps"))),
            ]
        )
        return rows

    _HEAD = (
        "RUN",
        "GPUS",
        "STANDARD GPU-H",
        "PREEMPTIBLE GPU-H",
        "PREEMPTIONS",
        "LOST GPU-H",
        "LOST STEPS",
    )

    def _footer(self) -> str:
        cost = self.cost
        if cost is None:
            return "prices not set: %config Tg.standard_price = ... and Tg.preemptible_price = ..."
        return (
            f"cost {cost:.2f} at {self.standard_price}/GPU-h standard and "
            f"{self.preemptible_price}/GPU-h preemptible"
        )

    def __str__(self) -> str:
        rows = [list(self._HEAD), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        head = [f"({self.scope})"] if self.scope else []
        return "\n".join([*head, *lines, self._footer()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = escape
        head = "".join(f"<th>{e(h.lower())}</th>" for h in self._HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in self._rows()
        )
        scope = f"<caption>{e(self.scope)}</caption>" if self.scope else ""
        return (
            f'<div class="tgnb-cost"><table style="word-break:normal;overflow-wrap:normal">{scope}<thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table><div>{e(self._footer())}</div></div>"
        )


def _preempted_exit(e: Event) -> bool:
    data = e.data or {}
    return data.get("exit_reason") == "preempted" or data.get("exit_code") == EXIT_PREEMPTED


def run_cost(name: str, events: Iterable[Event], gpus: int, now: datetime | None = None) -> RunCost:
    """GPU-hours and lost work of one run from its lifecycle events.

    A stretch ends in a preemption when the process exits as preempted (exit code 75) or the run is
    requeued (a ``RunRequeued`` after a stretch counts once, with or without a ``RunExited``). A
    requeue with ``moved`` (the supervisor stopped the run to go back to preemptible nodes: exit 75
    too) is no preemption.
    """
    out = RunCost(name, gpus)
    end_now = (now or utcnow()).timestamp()
    seg: tuple[float, str | None] | None = None
    last_ckpt: tuple[float, int | None] | None = None
    last_step: int | None = None
    counted = True  # whether the last closed stretch was already counted as a preemption
    last_closed: tuple[float, float] | None = None
    #: the loss of a stretch that exited as preempted, counted unless a ``moved`` requeue follows
    pending: tuple[float, int] | None = None

    def loss(start: float, end: float) -> tuple[float, int]:
        saved_at = last_ckpt[0] if last_ckpt and last_ckpt[0] >= start else start
        steps = 0
        if last_step is not None and last_ckpt and last_ckpt[1] is not None:
            steps = max(last_step - last_ckpt[1], 0)
        return max(end - saved_at, 0.0) * gpus / 3600, steps

    def count(lost: tuple[float, int] | None) -> None:
        if lost is not None:
            out.preemptions += 1
            out.lost_gpu_hours += lost[0]
            out.lost_steps += lost[1]

    def close(t: float, preempted: bool) -> None:
        nonlocal seg, counted, last_closed, pending
        if seg is None:
            return
        start, node = seg
        hours = max(t - start, 0.0) * gpus / 3600
        if node_class(node or "") == "preemptible":
            out.preemptible_gpu_hours += hours
        else:
            out.standard_gpu_hours += hours
        if preempted:
            pending = loss(start, t)
        counted, last_closed, seg = preempted, (start, t), None

    for e in sorted(events, key=lambda e: e.time):
        if e.source == "cluster":
            continue
        t = e.time.timestamp()
        step = e.data.get("step") if e.data else None
        if isinstance(step, int):
            last_step = step
        if e.reason == ev.RUN_STARTED or (e.reason == ev.RUN_RESUMED and seg is None):
            close(t, False)
            count(pending)
            pending, seg = None, (t, e.node)
        elif e.reason == ev.CHECKPOINT_SAVED:
            last_ckpt = (t, step if isinstance(step, int) else None)
        elif e.reason == ev.RUN_EXITED:
            close(t, _preempted_exit(e))
        elif e.reason == ev.RUN_REQUEUED:
            moved = bool((e.data or {}).get("moved"))
            close(t, not moved)
            if not moved and pending is None and not counted and last_closed is not None:
                pending = loss(*last_closed)
            count(None if moved else pending)
            pending, counted = None, True
    close(end_now, False)
    count(pending)
    return out


def session_cost(
    runs: Mapping[str, tuple[Iterable[Event], int]],
    standard_price: float | None = None,
    preemptible_price: float | None = None,
    now: datetime | None = None,
) -> CostReport:
    """A `CostReport` for runs given as ``{name: (events, gpus)}``."""
    report = CostReport([], standard_price, preemptible_price)
    for name, (events, gpus) in runs.items():
        report.runs.append(run_cost(name, events, gpus, now))
    return report
