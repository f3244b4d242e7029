"""The small tables ``%tg`` displays: `Table` (text and HTML) and the events as aligned text or an
HTML table whose cells keep their words whole. Nothing secret goes in; every string is escaped."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tgnb.events import Event
from tgnb.markup import escape, plain


def scope_words(every: bool, others: int) -> str:
    """What a listing covers, and how to see the rest: the caption of ``%tg runs`` and ``%tg cost``."""
    if every:
        return "every run of the attached cluster"
    more = f"; {others} more on the cluster: add --all" if others else ""
    return f"runs launched or opened in this notebook{more}"


def events_text(events: Sequence[Event], tz: str = "UTC", header: bool = True) -> str:
    from tgnb.notebook.timeline import zone

    tzinfo = zone(tz)
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
        when = e.time.astimezone(tzinfo).strftime("%Y-%m-%d %H:%M:%S")
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
        from tgnb.notebook.timeline import zone

        e = escape
        if not self.events:
            return "<div>(no events)</div>"
        tzinfo = zone(self.tz)
        days = {ev.time.astimezone(tzinfo).date() for ev in self.events}
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
            when = ev.time.astimezone(tzinfo).strftime(clock)
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
