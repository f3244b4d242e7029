"""The calls the magics make on the Python API, and the small tables they display.

This is the only place that knows how a `tgnb.Session` is reached (``tgnb.session.attach``), so the
magics stay a thin parse; everything else is `Session`/`Run`/`Cluster` methods.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.events import Event, utcnow
from tgnb.markup import escape, plain

if TYPE_CHECKING:
    from tgnb.cloud import Cloud, ClusterState, WaitResult
    from tgnb.notebook.cost import CostReport
    from tgnb.runs import Run
    from tgnb.session import Preemption, Session


def attach(target: str | None, local: bool = False, time_scale: float | None = None) -> Session:
    """`tgnb.session.attach(name_or_id, local=, time_scale=)`: the Session the magics work on."""
    from tgnb.session import attach as _attach

    return _attach(target, local=local, time_scale=time_scale)


def clusters(session: Session | None) -> Table:
    """The project's clusters, from the attached session's cloud or from the environment."""
    cloud: Cloud
    if session is not None:
        cloud = session.cloud
    else:
        from tgnb.cloud import Cloud

        cloud = Cloud.from_env()
    rows = [
        (
            c.name,
            c.id,
            c.type,
            c.status,
            c.gpu_type,
            str(c.num_gpus),
            f"{c.allocated_preemptible_gpus}/{c.desired_preemptible_gpus}",
        )
        for c in cloud.clusters()
    ]
    head = ("NAME", "ID", "TYPE", "STATUS", "GPU", "STANDARD", "PREEMPTIBLE ALLOC/TARGET")
    return Table(head, rows, "no clusters in this project")


def scale(
    session: Session,
    preemptible: int,
    wait: bool,
    timeout: float | None = None,
    callback: Callable[[ClusterState], Any] | None = None,
) -> ClusterState | WaitResult:
    """`session.scale(preemptible=N, wait=...)`, with the progress callback while it waits."""
    if not wait:
        return session.scale(preemptible)
    if timeout is None:
        return session.scale(preemptible, wait=True, callback=callback)
    return session.scale(preemptible, wait=True, timeout=timeout, callback=callback)


def find_run(session: Session, name: str) -> Run:
    """`session.run(name)`; a missing run is a UsageError that says how to list them."""
    from tgnb.errors import NotFoundError

    try:
        return session.run(name)
    except (KeyError, NotFoundError):
        raise UsageError(
            f"no run named {name!r}: %tg runs --all lists the cluster's runs"
        ) from None


def scope_words(every: bool, others: int) -> str:
    """What a listing covers, and how to see the rest: the caption of ``%tg runs`` and ``%tg cost``."""
    if every:
        return "every run of the attached cluster"
    more = f"; {others} more on the cluster: add --all" if others else ""
    return f"runs launched or opened in this notebook{more}"


def runs_table(runs: Iterable[Run], every: bool = True, others: int = 0) -> Table:
    rows = []
    for run in runs:
        st = run.report()  # the engine's word (an error it gave is in its detail)
        rec = run.record
        summary = run.summary()  # steps as the program logged them, against its own max steps
        total = summary["max_steps"]
        rows.append(
            (
                rec.name,
                summary["kind"],
                st.state.value,
                f"{summary['steps']}/{total}" if total else str(summary["steps"]),
                rec.backend,
                ",".join(st.nodes) or "-",
                str(st.restart_count),
            )
        )
    if every:
        empty = "no runs on this cluster yet: %tg launch grpo"
    else:
        more = f" ({others} on the cluster: %tg runs --all)" if others else ""
        empty = f"no runs launched or opened in this notebook yet: %tg launch grpo{more}"
    caption = scope_words(every, others)
    head = ("RUN", "KIND", "STATE", "STEPS", "BACKEND", "NODES", "RESTARTS")
    return Table(head, rows, empty, caption)


def since(ago: timedelta | None) -> datetime | None:
    return utcnow() - ago if ago is not None else None


def filter_events(events: Iterable[Event], node: str | None, run: str | None) -> list[Event]:
    return [e for e in events if (node is None or e.node == node) and (run is None or e.run == run)]


def events_text(events: Sequence[Event], tz: str = "UTC", header: bool = True) -> str:
    from tgnb.notebook.timeline import _zone

    zone = _zone(tz)
    # columns as wide as their longest value (node names run to 30 characters and more)
    rw = max([27, *(len(e.reason) for e in events)])
    nw = max([26, *(len(e.node or "-") for e in events)])
    uw = max([16, *(len(e.run or "-") for e in events)])
    lines = (
        [f"{'TIME (' + tz + ')':<22} {'REASON':<{rw}} {'NODE':<{nw}} {'RUN':<{uw}} MESSAGE"]
        if header
        else []
    )
    for e in events:
        when = e.time.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")
        row = f"{when:<22} {e.reason:<{rw}} {e.node or '-':<{nw}} {e.run or '-':<{uw}} {e.message}"
        lines.append(row.rstrip())
    if header and not events:
        lines.append("(no events)")
    return plain("\n".join(lines))


#: Table cells keep their words whole (JupyterLab's output styles break text anywhere, which cut
#: "preempted" and "0.071 s" at the cell's edge); a table wider than the page scrolls instead.
NO_BREAK = "word-break:normal;overflow-wrap:normal"


@dataclass
class EventsTable:
    """``%tg events``: the events as aligned text, and as an HTML table whose cells do not break
    words (the time, reason, node and run on one line each; the message wraps between words)."""

    events: Sequence[Event]
    tz: str = "UTC"

    def __str__(self) -> str:
        return events_text(self.events, self.tz)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from tgnb.notebook.timeline import _zone

        e = escape
        if not self.events:
            return "<div>(no events)</div>"
        zone = _zone(self.tz)
        days = {ev.time.astimezone(zone).date() for ev in self.events}
        one_day = len(days) == 1  # then the date once, in the header, and clock times below
        clock = "%H:%M:%S" if one_day else "%Y-%m-%d %H:%M:%S"
        label = f"time ({self.tz}, {days.pop():%Y-%m-%d})" if one_day else f"time ({self.tz})"
        nowrap = f"{NO_BREAK};white-space:nowrap"
        head = "".join(
            f"<th style='{nowrap};text-align:left'>{e(h)}</th>"
            for h in (label, "reason", "node", "run", "message")
        )
        rows = []
        for ev in self.events:
            when = ev.time.astimezone(zone).strftime(clock)
            cells = [when, ev.reason, ev.node or "-", ev.run or "-"]
            tds = "".join(f"<td style='{nowrap};text-align:left'>{e(c)}</td>" for c in cells)
            message = (
                f"<td style='{NO_BREAK};text-align:left'>"
                f"<div style='min-width:20em'>{_whole_words(ev.message)}</div></td>"
            )
            rows.append(f"<tr>{tds}{message}</tr>")
        return (
            f"<div class='tgnb-events' style='overflow-x:auto'>"
            f"<table class='tgnb-table' style='{NO_BREAK};table-layout:auto'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )


def _whole_words(text: str) -> str:
    """`text` escaped, each word that holds a hyphen or a slash (a node name, a time stamp, a
    path) kept on one line: a browser may otherwise break it after the hyphen."""
    out = []
    for part in re.split(r"(\s+)", text):
        if part and not part.isspace() and ("-" in part or "/" in part):
            out.append(f"<span style='white-space:nowrap'>{escape(part)}</span>")
        else:
            out.append(escape(part))
    return "".join(out)


def preempt(session: Session, node: str | None) -> Preemption:
    """`session.preempt(node)`: emulator only (the Session refuses, sending nothing, elsewhere)."""
    return session.preempt(node)


def cost(
    runs: Iterable[Run],
    standard_price: float | None,
    preemptible_price: float | None,
    scope: str = "",
) -> CostReport:
    """A `CostReport` of `runs` from their lifecycle events; `scope` says which runs they are."""
    from tgnb.notebook.cost import session_cost

    by_name: dict[str, tuple[list[Event], int]] = {}
    for run in runs:
        res = run.record.spec.resources
        events = run.run_events()
        by_name[run.name] = (events, int(res.gpus_per_node) * int(res.nodes))
    report = session_cost(by_name, standard_price, preemptible_price)
    report.scope = scope
    return report


@dataclass
class Table:
    """A small table with a text and an HTML rendering (nothing secret goes in)."""

    head: tuple[str, ...]
    rows: Sequence[Sequence[str]]
    empty: str = "(none)"
    caption: str = ""

    def __str__(self) -> str:
        if not self.rows:
            return self.empty
        all_rows: list[Sequence[str]] = [self.head, *self.rows]
        widths = [max(len(r[i]) for r in all_rows) for i in range(len(self.head))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in all_rows
        ]
        return plain("\n".join([f"({self.caption})", *lines] if self.caption else lines))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = escape
        if not self.rows:
            return f"<div>{e(self.empty)}</div>"
        head = "".join(f"<th>{e(h.lower())}</th>" for h in self.head)
        body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in r) + "</tr>" for r in self.rows)
        caption = f"<caption>{e(self.caption)}</caption>" if self.caption else ""
        return (
            f"<table class='tgnb-table' style='{NO_BREAK}'>{caption}<thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )
