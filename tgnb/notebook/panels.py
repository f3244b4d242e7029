"""What every live panel shares (`tgnb.notebook.widgets`' `ClusterPanel` and `RunPanel`,
`tgnb.notebook.pt_panel`'s `ResourcePanel`): the `Panel` base (a poller that stops on close, an
error line, a static HTML rendering in its mime bundle, `Panel.snapshot`), the `Poller` daemon
thread, and `refresh_displays`, the ``post_run_cell`` hook that brings the displays of the live
panels up to date as each cell ends, until their last state (a run's end) has been sent: the
``text/html`` and ``text/plain`` that an executed notebook's HTML keeps show each panel's final
state, not the state of the cell that showed it.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import ipywidgets as W
from IPython.display import HTML

from tgnb.markup import escape


def _text_of(html: str, limit: int = 400) -> str:
    """The words an HTML fragment shows (no chart's SVG, style or script), on one line."""
    from html.parser import HTMLParser

    class _Words(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.words: list[str] = []
            self.hidden = 0

        def handle_starttag(self, tag: str, attrs: Any) -> None:
            self.hidden += tag in ("svg", "style", "script")

        def handle_endtag(self, tag: str) -> None:
            if tag in ("svg", "style", "script") and self.hidden > 0:
                self.hidden -= 1

        def handle_data(self, data: str) -> None:
            if not self.hidden:
                self.words += data.split()

    parser = _Words()
    parser.feed(html)
    text = re.sub(r"·(\s*·)+", "·", " ".join(parser.words)).strip(" ·")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Snapshot(HTML):
    """A panel as it was (`Panel.snapshot`): its HTML for notebooks and exports; in text, the
    words it shows."""

    def __repr__(self) -> str:
        return _text_of(self.data or "")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


class Poller:
    """Calls `tick()` every `interval` seconds on a daemon thread until `stop()`."""

    def __init__(self, tick: Callable[[], bool | None], interval: float, name: str) -> None:
        self.tick = tick
        self.interval = interval
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.tick() is False:
                return

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        thread = self._thread
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(self.interval, 1.0) + 5.0)


class Panel(W.VBox):
    """The base of the live panels (`ClusterPanel`, `RunPanel`, `pt_panel.ResourcePanel`): a
    poller that stops on close, an error line, a static HTML mime type."""

    _poller: Poller
    error: W.HTML

    def _guard(self, fn: Callable[[], Any]) -> bool | None:
        try:
            result = fn()
        except Exception as e:  # a failed poll is shown, the next one may succeed
            from tgnb.config import scrub

            self.error.value = f"<span style='color:#b00'>{escape(scrub(str(e)))}</span>"
            return None
        return None if result is None else bool(result)

    def close(self) -> None:
        self._poller.stop(join=False)
        super().close()

    def show(self) -> None:
        """Display the panel under a display id: `refresh_displays` (after this cell and each
        later one, while the panel polls) re-sends its bundle when its static rendering changed,
        so the ``text/html`` and ``text/plain`` fallbacks that papermill and nbconvert keep hold
        its last state: a ``%tg watch`` shown while the run started reads the run's end once a
        later cell ends after it (nbclient updates every output of a display id). A run still
        going when the notebook's last cell ends is shown as it was then."""
        from IPython.display import display

        self._sent = self.to_html()
        self._handle = display(self._repr_mimebundle_(), raw=True, display_id=True)
        _SHOWN.add(self)
        _hook_refresh()

    def _ipython_display_(self) -> None:
        """A panel that is a cell's value (``tgnb.panel(res)``, ``%tg pt panel``) is shown as
        `show` shows it, so its export holds its state as of the end of its cell; in a terminal
        IPython, once."""
        from tgnb.progress import in_kernel

        if in_kernel():
            self.show()
        else:
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)

    def refresh_display(self) -> bool:
        """Re-send the displayed bundle if the panel's static rendering changed; whether it did."""
        handle = getattr(self, "_handle", None)
        if handle is None:
            return False
        if self._poller.running:  # live: read the latest state now, not at the next poll
            self._guard(self.refresh)
        rendered = self.to_html()
        if rendered == self._sent:
            return False
        self._sent = rendered
        handle.update(self._repr_mimebundle_(), raw=True)
        return True

    def refresh(self) -> None:
        raise NotImplementedError

    def to_html(self) -> str:
        raise NotImplementedError

    def snapshot(self) -> Any:
        """The panel as it is now, as a plain HTML display object (for papermill outputs), whose
        text form is the panel's text (not ``<IPython.core.display.HTML object>``)."""
        return Snapshot(self.to_html())

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = dict(super()._repr_mimebundle_(**kwargs) or {})
        data["text/html"] = html = self.to_html()
        data["text/plain"] = _text_of(html)  # the panel's words, not ``RunPanel(...)``
        return data


#: Panels shown with `Panel.show` whose displays `refresh_displays` brings up to date as each cell
#: ends, until the panel stops polling (its run has ended, or it was closed).
_SHOWN: weakref.WeakSet[Panel] = weakref.WeakSet()


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _hook_refresh() -> None:
    """Refresh shown panels after each cell also where ``%load_ext tgnb`` was never run (a
    notebook that only ``import tgnb`` and shows ``tgnb.panel(res)``)."""
    shell = _shell()
    events = getattr(shell, "events", None)
    if events is not None and refresh_displays not in events.callbacks["post_run_cell"]:
        events.register("post_run_cell", refresh_displays)


_REFRESHED_FOR: list[Any] = [None]  # the cell result of the last refresh (two hooks, one pass)


def refresh_displays(*args: Any) -> None:
    """Bring the displayed bundles of the shown panels up to date (an IPython ``post_run_cell``
    hook, so the update belongs to the cell that just ran and papermill records it, on every
    output of the panel's display id), and leave each once it no longer polls: its last state
    has been sent, which is what an export shows. Once per cell: ``%load_ext tgnb`` and the
    first shown panel may both have hooked it (both pass the cell's result)."""
    if args and args[0] is not None:
        if args[0] is _REFRESHED_FOR[0]:
            return
        _REFRESHED_FOR[0] = args[0]
    for panel in list(_SHOWN):
        if not panel._poller.running:
            _SHOWN.discard(panel)  # this refresh sends its last state
        # a display that cannot be updated must not fail the user's cell
        with contextlib.suppress(Exception):
            panel.refresh_display()


__all__ = ["Panel", "Poller", "Snapshot", "refresh_displays"]
