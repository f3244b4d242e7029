"""``%tg events [--since 30m] [--node N] [--run R] [--watch | --timeline]``: `Session.events`, as a
table, an `EventTimeline`, or printed as they come."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tgnb.events import Event, utcnow
from tgnb.notebook.commands.grammar import Parser, duration, name_arg
from tgnb.notebook.tables import EventsTable, events_text

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--since", type=duration, default=None, help="e.g. 30m, 2h, 1d")
    p.add_argument("--node", type=name_arg, help="only this node's events")
    p.add_argument("--run", type=name_arg, help="only this run's events")
    p.add_argument(
        "--watch", action="store_true", help="keep printing new events (interrupt to stop)"
    )
    p.add_argument("--timeline", action="store_true", help="draw them as an EventTimeline")


def _only(events: Iterable[Event], node: str | None, run: str | None) -> list[Event]:
    return [e for e in events if (node is None or e.node == node) and (run is None or e.run == run)]


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    session = tg.attached()
    since = utcnow() - args.since if args.since is not None else None
    events = _only(session.events(since=since), args.node, args.run)
    if args.timeline:
        from tgnb.notebook.timeline import EventTimeline

        return EventTimeline(events, tz=tg.timezone)
    from IPython.display import display

    display(EventsTable(events, tg.timezone))
    if not args.watch:
        return None
    seen = {e.key for e in events}
    try:
        while True:
            time.sleep(tg.poll_interval)
            fresh = [
                e
                for e in _only(session.events(since=since), args.node, args.run)
                if e.key not in seen
            ]
            seen.update(e.key for e in fresh)
            if fresh:
                print(events_text(fresh, tg.timezone, header=False), flush=True)
    except KeyboardInterrupt:
        return None
