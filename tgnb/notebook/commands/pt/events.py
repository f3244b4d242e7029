"""``%tg pt events [--timeline] [--resource ID]``: `Resource.events()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, name_arg
from tgnb.notebook.tables import EventsTable

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--resource", type=name_arg, help="another resource id")
    p.add_argument("--timeline", action="store_true", help="draw them as an EventTimeline")


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    events = tg.pt_state().current(args.resource).events()
    if args.timeline:
        from tgnb.notebook.timeline import EventTimeline

        return EventTimeline(events, tz=tg.timezone)
    from IPython.display import display

    display(EventsTable(events, tg.timezone))
    return None
