"""The calls the magics make on the Python API, and the small tables they display.

This is the only place that knows how a `tgnb.Session` is reached (``tgnb.session.attach``), so the
magics stay a thin parse; everything else is `Session`/`Run`/`Cluster` methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.events import Event, parse_time, utcnow
from tgnb.markup import escape, plain

if TYPE_CHECKING:
    from tgnb.cloud import Cloud, ClusterState, WaitResult
    from tgnb.notebook.cost import CostReport
    from tgnb.runs import Run
    from tgnb.session import Session


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
        raise UsageError(f"no run named {name!r}: %tg runs lists this session's runs") from None


def runs_table(runs: Iterable[Run]) -> Table:
    rows = []
    for run in runs:
        rec = run.refresh()
        rows.append(
            (
                rec.name,
                rec.state.value,
                rec.backend,
                ",".join(rec.nodes) or "-",
                str(rec.restart_count),
            )
        )
    return Table(("RUN", "STATE", "BACKEND", "NODES", "RESTARTS"), rows, "no runs yet: %tg launch")


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


def preempt(session: Session, node: str | None) -> Preempted:
    """`session.preempt(node)`: emulator only (the Session refuses, sending nothing, elsewhere)."""
    return Preempted.from_view(session.preempt(node))


@dataclass(frozen=True)
class Preempted:
    """What ``%tg preempt`` did: the node, when the notice came, when the node goes away."""

    node: str
    notified_at: str | None
    deadline: str | None

    @classmethod
    def from_view(cls, view: dict[str, Any]) -> Preempted:
        return cls(str(view.get("name", "?")), view.get("notified_at"), view.get("deadline"))

    def __repr__(self) -> str:
        notice = _clock(self.notified_at)
        gone = _clock(self.deadline)
        return f"preempted {self.node}: notice at {notice}, removed at {gone} (end of drain window)"

    def _repr_html_(self) -> str:
        return f"<code>{escape(repr(self))}</code>"


def _clock(stamp: str | None) -> str:
    """``2026-11-30T21:30:17.133Z`` as ``21:30:17Z``."""
    if not stamp:
        return "-"
    try:
        return parse_time(stamp).strftime("%H:%M:%SZ")
    except (TypeError, ValueError):
        return stamp


def cost(
    session: Session, standard_price: float | None, preemptible_price: float | None
) -> CostReport:
    """A `CostReport` of this session's runs from their lifecycle events."""
    from tgnb.notebook.cost import session_cost

    runs: dict[str, tuple[list[Event], int]] = {}
    for run in session.runs():
        res = run.record.spec.resources
        events = run.run_events()
        runs[run.name] = (events, int(res.gpus_per_node) * int(res.nodes))
    return session_cost(runs, standard_price, preemptible_price)


@dataclass
class Table:
    """A small table with a text and an HTML rendering (nothing secret goes in)."""

    head: tuple[str, ...]
    rows: Sequence[Sequence[str]]
    empty: str = "(none)"

    def __str__(self) -> str:
        if not self.rows:
            return self.empty
        all_rows: list[Sequence[str]] = [self.head, *self.rows]
        widths = [max(len(r[i]) for r in all_rows) for i in range(len(self.head))]
        return plain(
            "\n".join(
                "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                for r in all_rows
            )
        )

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = escape
        if not self.rows:
            return f"<div>{e(self.empty)}</div>"
        head = "".join(f"<th>{e(h.lower())}</th>" for h in self.head)
        body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in r) + "</tr>" for r in self.rows)
        return (
            f"<table class='tgnb-table'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
