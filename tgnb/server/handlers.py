"""The HTTP API of the server extension, under ``<base_url>/tgnb/``.

Every handler method is ``@tornado.web.authenticated``; `APIHandler` checks the XSRF token on
every non-GET request. Errors are JSON ``{"message": "..."}`` (one line, secrets scrubbed, local
paths cut to their last part): bad input 400 (a body that is not a flat JSON object of the route's
fields, naming an unknown one), a body over `MAX_BODY` bytes 413, unknown run or cluster 404, the
clusters API unreachable or refusing the key 502/503.

- ``GET  /tgnb/status``            whether a session is attached (never attaches)
- ``GET  /tgnb/cluster``           the attached cluster (attaches on first use; a read starts no
  local emulator: 503 naming the fix when none runs, while ``POST /tgnb/attach`` may start one)
- ``POST /tgnb/attach``            ``{"cluster": "name or id", "local": false}``
- ``POST /tgnb/scale``             ``{"preemptible": 16}`` (a multiple of 8, >= 0)
- ``GET  /tgnb/runs``              the runs on the attached cluster
- ``GET  /tgnb/runs/<name>``       one run, with its status history and events
- ``GET  /tgnb/runs/<name>/timeline``  the run's timeline as SVG
- ``GET  /tgnb/runs/<name>/logs?cursor=N&attempt=K``  the run's live log after a cursor, as
  ``run.logs(follow=True)`` shows it (`tgnb.runs.livelog.page`): each attempt headed (node, start,
  how the one before ended), the program's lines, the run's end; poll with the answer's ``cursor``
  and ``attempt`` until ``done``
- ``GET  /tgnb/sweeps``            the sweeps of the attached cluster (`tgnb.runs.sweeps.Sweep`)
- ``GET  /tgnb/sweeps/<name>``     one sweep with its table (a row per run)
- ``GET  /tgnb/sweeps/<name>/chart``  the sweep's chart as SVG: its runs' curves, their preemptions
- ``POST /tgnb/sweeps/<name>/stop``   stop every unfinished run of the sweep (each checkpoints)
- ``GET  /tgnb/events``            server-sent events: the feed of `tgnb.server.service.Cockpit`
  (it waits, sending keepalives, until something attaches the session)
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from tgnb.cloud.validate import MAX_NAME
from tgnb.config import scrub
from tgnb.errors import (
    AmbiguousNameError,
    AuthenticationError,
    EmulatorError,
    NotFoundError,
    TgnbError,
    TransientApiError,
    ValidationError,
)
from tgnb.server.serialize import cluster_json, leftovers_json, run_json, sweep_json
from tgnb.server.service import LOST, Cockpit

#: A comment line sent on an idle event stream so proxies keep it open (seconds).
KEEPALIVE_S = 15.0
#: Longest ``?timeout=`` of an event stream (seconds).
MAX_TIMEOUT_S = 3600.0


def _status_of(exc: TgnbError) -> int:
    if isinstance(exc, ValidationError | AmbiguousNameError):
        return 400
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, TransientApiError | EmulatorError):
        return 503
    if isinstance(exc, AuthenticationError):
        return 502  # the clusters API refused the key; 401 would ask the browser to log in
    return 500


#: Largest request body read (bytes): the bodies are a few fields; larger ones are refused (413)
#: before any parsing, so a 60 MB body does not hold the server's IO loop.
MAX_BODY = 1 << 20
#: Deepest nesting of a request body's JSON (the routes' bodies are flat objects).
MAX_DEPTH = 8
#: An absolute path (not a URL's): shown by its last part only, so answers leak no local paths.
_PATH = re.compile(r"(?<![\w:/.])/(?:[\w.@+-]+/)+([\w.@+-]+)")


def one_line(text: str) -> str:
    """One scrubbed line of at most 500 characters, absolute paths cut to their last part."""
    return _PATH.sub(r"…/\1", scrub(" ".join(str(text).split())))[:500]


def _depth(value: Any, limit: int) -> int:
    """How deep `value` nests (a scalar is 0), counting no further than `limit` + 1."""
    if limit < 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


class TgnbHandler(APIHandler):
    """Common ground: the server's `Cockpit`, JSON bodies, and tgnb errors as JSON."""

    @property
    def cockpit(self) -> Cockpit:
        cockpit: Cockpit = self.settings["tgnb_cockpit"]
        return cockpit

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run a blocking call on the session; a tgnb error finishes the request as JSON (and
        one that says the platform no longer answers there drops the session: `Cockpit.lost`)."""
        session = self.cockpit.attached
        try:
            return await self.cockpit.run(fn)
        except TgnbError as exc:
            if isinstance(exc, LOST) and session is not None:
                self.cockpit.lost(session, one_line(str(exc)))
            self.fail(_status_of(exc), str(exc))
            return None
        except Exception as exc:  # an SDK or library error the session did not translate
            from tgnb.cloud.client import is_sdk_error, translate

            if is_sdk_error(exc):
                err = translate(exc, "answer the sidebar")
                self.fail(_status_of(err), str(err))
            else:
                self.log.error("tgnb: %s", one_line(f"{type(exc).__name__}: {exc}"))
                self.fail(500, f"tgnb failed ({type(exc).__name__}); see the Jupyter server log")
            return None

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": one_line(message)}))

    def send(self, payload: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    def body_object(self, fields: tuple[str, ...], example: str) -> dict[str, Any] | None:
        """The request body as a JSON object with no fields but `fields`; None (after a 4xx)
        when it is not one: more than `MAX_BODY` bytes (413, before parsing), not JSON, nested
        deeper than `MAX_DEPTH`, not an object, or with a field the route does not know (400,
        naming it)."""
        raw = self.request.body or b"{}"
        if len(raw) > MAX_BODY:
            self.fail(413, f"the request body is {len(raw):,} bytes; at most {MAX_BODY:,} are read")
            return None
        deep = False
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        except RecursionError:
            body, deep = None, True
        if deep or _depth(body, MAX_DEPTH) > MAX_DEPTH:
            self.fail(400, f"the request body nests deeper than {MAX_DEPTH} levels: send {example}")
            return None
        if not isinstance(body, dict):
            self.fail(400, f"the request body must be a JSON object, e.g. {example}")
            return None
        unknown = sorted(str(k) for k in body if k not in fields)
        if unknown:
            names = ", ".join(repr(k[:40]) for k in unknown[:5])
            self.fail(400, f"unknown field(s) {names}: this route takes {', '.join(fields)}")
            return None
        return body


class StatusHandler(TgnbHandler):
    """Whether the server has attached a session yet; never attaches and sends no request."""

    @web.authenticated
    async def get(self) -> None:
        session = self.cockpit.attached
        if session is None:
            return self.send({"attached": False, "cluster": None})
        self.send({"attached": True, "cluster": cluster_json(session.cluster.last)})


class ClusterHandler(TgnbHandler):
    @web.authenticated
    async def get(self) -> None:
        cockpit = self.cockpit

        def read() -> dict[str, Any]:
            s = cockpit.session()
            return cluster_json(s.status(), s)

        result = await self.call(read)
        if result is not None:
            self.send(result)


class AttachHandler(TgnbHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.body_object(("cluster", "local"), '{"cluster": "my-cluster"}')
        if body is None:
            return
        target, local = body.get("cluster"), body.get("local", False)
        if target is not None and (
            not isinstance(target, str)
            or not target.strip()
            or len(target) > MAX_NAME
            or not target.isprintable()
        ):
            return self.fail(
                400,
                f"cluster must be a cluster name or id (a printable string of at most {MAX_NAME} "
                "characters), or null",
            )
        if not isinstance(local, bool):
            return self.fail(400, "local must be true or false")
        cockpit = self.cockpit

        def attach() -> dict[str, Any]:
            s = cockpit.attach(target.strip() if target else None, local)
            return cluster_json(s.cluster.last, s)

        result = await self.call(attach)
        if result is not None:
            self.send(result)


class ScaleHandler(TgnbHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.body_object(("preemptible",), '{"preemptible": 16}')
        if body is None:
            return
        if "preemptible" not in body:
            return self.fail(400, 'send {"preemptible": N} with N a multiple of 8, e.g. 16')
        target = body["preemptible"]
        cockpit = self.cockpit

        def scale() -> dict[str, Any]:
            s = cockpit.session(start=True)  # a write: may start the local emulator
            state = s.cluster.scale(target)  # checked before any request (ValidationError)
            return cluster_json(state, s)

        result = await self.call(scale)
        if result is not None:
            self.send(result)


class RunsHandler(TgnbHandler):
    @web.authenticated
    async def get(self) -> None:
        cockpit = self.cockpit
        result = await self.call(lambda: [run_json(r) for r in cockpit.session().runs()])
        if result is not None:
            self.send({"runs": result})


class RunHandler(TgnbHandler):
    @web.authenticated
    async def get(self, name: str) -> None:
        cockpit = self.cockpit
        result = await self.call(lambda: run_json(cockpit.session().run(name), detail=True))
        if result is not None:
            self.send(result)


class LeftoversHandler(TgnbHandler):
    """Post-Training resources left billing by processes that are gone (`serialize.leftovers_json`):
    read from the tgnb home's registry; the service is asked only when it holds such an entry."""

    @web.authenticated
    async def get(self) -> None:
        from tgnb.config import default_home

        result = await self.call(lambda: leftovers_json(default_home()))
        if result is not None:
            self.send(result)


class TimelineHandler(TgnbHandler):
    @web.authenticated
    async def get(self, name: str) -> None:
        cockpit = self.cockpit

        def draw() -> str:
            from tgnb.notebook.timeline import timeline

            run = cockpit.session().run(name)
            return str(timeline(run, title=f"run {run.name}").to_svg())

        svg = await self.call(draw)
        if svg is not None:
            self.finish(svg, set_content_type="image/svg+xml")


class LogsHandler(TgnbHandler):
    """A page of a run's live log (`tgnb.runs.livelog.page`): ``{"lines": [{"kind", "text"}],
    "cursor", "attempt", "done"}``, each line's secrets masked."""

    @web.authenticated
    async def get(self, name: str) -> None:
        try:
            cursor = int(self.get_argument("cursor", "0"))
            attempt = int(self.get_argument("attempt", "-1"))
        except ValueError:
            return self.fail(400, "cursor and attempt must be integers (start with cursor=0)")
        if not 0 <= cursor < 2**63 or not -1 <= attempt < 2**31:
            return self.fail(400, "cursor must be >= 0 and attempt >= -1 (start with cursor=0)")
        cockpit = self.cockpit

        def read() -> dict[str, Any]:
            from tgnb.runs import livelog

            got = livelog.page(cockpit.session().run(name), cursor, attempt)
            return {
                "lines": [{"kind": kind, "text": scrub(text)} for kind, text in got.lines],
                "cursor": got.cursor,
                "attempt": got.attempt,
                "done": got.done,
            }

        result = await self.call(read)
        if result is not None:
            self.send(result)


class EventsHandler(TgnbHandler):
    """Server-sent events: every message of the feed numbered as its ``id``.

    A new client gets the latest cluster and runs snapshots and the recent events
    (`Cockpit.replay`); ``?since=N`` (or the ``Last-Event-ID`` header) resumes after message N,
    at most `tgnb.server.service.REPLAY` messages. ``?timeout=S`` (0 < S <= `MAX_TIMEOUT_S`; 0 or
    absent: no end) ends the stream after S seconds (tests, clients that prefer to reconnect).
    """

    @web.authenticated
    async def get(self) -> None:
        try:
            raw_since = self.get_argument("since", self.request.headers.get("Last-Event-ID", ""))
            since = int(raw_since) if raw_since.strip() else None
            timeout = float(self.get_argument("timeout", "0"))
        except ValueError:
            return self.fail(400, "since must be an integer and timeout a number of seconds")
        if since is not None and not 0 <= since < 2**63:
            return self.fail(400, "since must be a message id >= 0")
        if not math.isfinite(timeout) or not 0 <= timeout <= MAX_TIMEOUT_S:
            return self.fail(
                400, f"timeout must be a number of seconds from 0 to {MAX_TIMEOUT_S:g} (0: no end)"
            )
        cockpit = self.cockpit
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        deadline = time.monotonic() + timeout if timeout > 0 else None
        cockpit.listeners += 1
        try:
            cockpit.ensure_poller()
            self.write(": tgnb event stream\n\n")
            await self.flush()
            while deadline is None or time.monotonic() < deadline:
                changed = cockpit.changed()
                for seq, message in cockpit.replay(since):
                    self.write(f"id: {seq}\ndata: {json.dumps(message)}\n\n")
                    since = seq
                if since is None:  # nothing to replay yet: from now on, what comes next
                    since = cockpit.seq
                await self.flush()
                wait = KEEPALIVE_S
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                try:
                    await asyncio.wait_for(changed.wait(), wait)
                except TimeoutError:
                    self.write(": keepalive\n\n")
        except StreamClosedError:
            return
        finally:
            cockpit.listeners -= 1
        self.finish(set_content_type="text/event-stream")


class SweepsHandler(TgnbHandler):
    @web.authenticated
    async def get(self) -> None:
        cockpit = self.cockpit
        result = await self.call(lambda: [sweep_json(s) for s in cockpit.session().sweeps()])
        if result is not None:
            self.send({"sweeps": result})


class SweepHandler(TgnbHandler):
    @web.authenticated
    async def get(self, name: str) -> None:
        cockpit = self.cockpit
        result = await self.call(lambda: sweep_json(cockpit.session().sweep(name), detail=True))
        if result is not None:
            self.send(result)


class SweepChartHandler(TgnbHandler):
    @web.authenticated
    async def get(self, name: str) -> None:
        cockpit = self.cockpit

        def draw() -> str:
            from tgnb.notebook.sweep_view import chart_svg

            return chart_svg(cockpit.session().sweep(name).curves())

        svg = await self.call(draw)
        if svg is not None:
            self.finish(svg, set_content_type="image/svg+xml")


class SweepStopHandler(TgnbHandler):
    """Stop every unfinished run of a sweep: ``{"stopped": [names]}`` (none: all had finished)."""

    @web.authenticated
    async def post(self, name: str) -> None:
        cockpit = self.cockpit
        result = await self.call(lambda: cockpit.session().sweep(name).stop())
        if result is not None:
            self.send({"stopped": result})


def routes() -> list[tuple[str, type[TgnbHandler]]]:
    """Every route of the extension, relative to the server's base URL."""
    name = r"(?P<name>[^/]+)"
    paths: list[tuple[str, type[TgnbHandler]]] = [
        ("status", StatusHandler),
        ("cluster", ClusterHandler),
        ("attach", AttachHandler),
        ("scale", ScaleHandler),
        ("runs", RunsHandler),
        (f"runs/{name}", RunHandler),
        (f"runs/{name}/timeline", TimelineHandler),
        (f"runs/{name}/logs", LogsHandler),
        ("sweeps", SweepsHandler),
        (f"sweeps/{name}", SweepHandler),
        (f"sweeps/{name}/chart", SweepChartHandler),
        (f"sweeps/{name}/stop", SweepStopHandler),
        ("events", EventsHandler),
        ("posttraining/leftovers", LeftoversHandler),
    ]
    return [(url_path_join("/tgnb", path), cls) for path, cls in paths]
