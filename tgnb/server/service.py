"""`Cockpit`: the one `Session` of a Jupyter server and the live feed the sidebar listens to.

The session is attached lazily on first use (`tgnb.attach`, so with no ``TOGETHER_API_KEY`` it is
the local emulator's demo cluster), exactly as the ``%tg`` magics attach. A poller reads the
cluster and the runs every `poll_interval` seconds while somebody listens, and appends what changed
to a bounded buffer of numbered messages:

- ``{"type": "cluster", "cluster": {...}}`` when the cluster snapshot changed;
- ``{"type": "runs", "runs": [...]}`` when a run's status or progress changed;
- ``{"type": "event", "event": {...}, "live": bool}`` for each new cluster or run event;
- ``{"type": "run_state", "run": name, "from": state, "to": state}`` when a run changed state
  (``"from": null`` for a run first seen while listening);
- ``{"type": "detached", "message": "..."}`` when the platform stopped answering (an emulator
  stopped, or restarted on another port): the session is dropped, and the next read attaches
  again to wherever the platform answers now (the browser retries that read every few seconds).

Messages from the first poll after an attach describe the past (``"live": false``): the browser
lists them but raises no notification for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tgnb.config import scrub
from tgnb.errors import AuthenticationError, EmulatorError, TransientApiError
from tgnb.server.serialize import cluster_json, event_json, run_json

if TYPE_CHECKING:
    from tgnb.session import Session

T = TypeVar("T")

#: How many messages the feed keeps for listeners that reconnect.
BUFFER = 2000
#: Most messages one (re)connection replays: the latest snapshots plus the newest events.
REPLAY = 200
#: The errors that mean the attached platform no longer answers there (connection refused, the
#: emulator gone or its key changed with a restart): the session is dropped and attached again.
LOST = (TransientApiError, EmulatorError, AuthenticationError)


class Cockpit:
    """The server's `Session` (one per Jupyter server) and its feed of cluster and run changes."""

    def __init__(
        self,
        *,
        cluster: str | None = None,
        local: bool = False,
        poll_interval: float = 1.0,
        attach: Callable[..., Session] | None = None,
    ) -> None:
        self.cluster = cluster
        self.local = local
        self.poll_interval = float(poll_interval)
        self._attach = attach
        self._session: Session | None = None
        self._lock = threading.RLock()
        self.messages: deque[tuple[int, dict[str, Any]]] = deque(maxlen=BUFFER)
        self.seq = 0
        self._changed: asyncio.Event | None = None
        self._poller: asyncio.Task[None] | None = None
        self.listeners = 0
        self._reset_feed()

    def _reset_feed(self) -> None:
        self._primed = False
        self._seen: set[tuple[Any, ...]] = set()
        self._last_cluster: dict[str, Any] | None = None
        self._last_runs: dict[str, dict[str, Any]] | None = None
        self._resend = False

    # -- the session ---------------------------------------------------------------------------
    @property
    def attached(self) -> Session | None:
        """The session when one is attached already (no attach, no request)."""
        return self._session

    def session(self, start: bool = False) -> Session:
        """The attached `Session`, attached now when there is none yet (blocking). A read
        (`start` False) starts no local emulator: it attaches only to one that runs."""
        with self._lock:
            if self._session is None:
                self._session = self._connect(self.cluster, self.local, start=start)
            return self._session

    def _connect(self, cluster: str | None, local: bool, start: bool = True) -> Session:
        if self._attach is not None:
            return self._attach(cluster, local=local, start=start)
        from tgnb.session import attach

        # local False: not asked for, so the key decides (the default of `tgnb.attach`)
        return attach(cluster, local=local or None, start=start)

    def attach(self, cluster: str | None, local: bool | None = None) -> Session:
        """Attach to another cluster (by name or id); the feed starts again from its history."""
        local = self.local if local is None else local
        session = self._connect(cluster, local)
        with self._lock:
            old, self._session = self._session, session
            self.cluster, self.local = cluster, local
            self._reset_feed()
        if old is not None and old is not session:
            with contextlib.suppress(Exception):
                old.cloud.close()
        return session

    async def aclose(self) -> None:
        """Stop the poller (waiting for it) and close the session."""
        poller, self._poller = self._poller, None
        if poller is not None and not poller.done():
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await poller
        self.close()

    def close(self) -> None:
        """Close the session's HTTP connections (the poller, if any, is left to `aclose`)."""
        with self._lock:
            if self._session is not None:
                with contextlib.suppress(Exception):
                    self._session.cloud.close()
            self._session = None

    def lost(self, session: Session, message: str) -> None:
        """`session` stopped answering: drop it (when it is still the attached one), so the next
        read attaches again, and tell the listeners. The feed's history stays (an event seen
        before is not sent twice); the next snapshots are sent whatever they hold."""
        with self._lock:
            if self._session is not session:
                return
            self.close()
            self._last_cluster = None  # sent again on the next read, as is the runs snapshot
            self._resend = True
        self._publish({"type": "detached", "message": message})
        self._wake()

    # -- the feed ------------------------------------------------------------------------------
    def _publish(self, message: dict[str, Any]) -> None:
        self.seq += 1
        self.messages.append((self.seq, message))

    def poll(self) -> list[dict[str, Any]]:
        """Read the cluster and the runs once; return the messages for what changed (blocking)."""
        with self._lock:
            if self._session is None:
                return []  # the feed never attaches by itself: opening the sidebar does
            session = self._session
            live = self._primed
            out: list[dict[str, Any]] = []
            events = list(session.cluster.poll_events())
            cluster = cluster_json(session.cluster.last, session)
            cluster.pop("fetched_at", None)
            if cluster != self._last_cluster:
                self._last_cluster = cluster
                out.append({"type": "cluster", "cluster": cluster})
            runs = {}
            for run in session.runs():
                runs[run.name] = run_json(run)
                events.extend(run.run_events())
            from tgnb.events import dedupe

            for ev in dedupe(events, self._seen):
                out.append({"type": "event", "event": event_json(ev), "live": live})
            for name, now in runs.items():
                before = (self._last_runs or {}).get(name)
                if live and (before is None or before["state"] != now["state"]):
                    was = None if before is None else before["state"]
                    out.append({"type": "run_state", "run": name, "from": was, "to": now["state"]})
            if runs != self._last_runs or self._resend:
                self._last_runs, self._resend = runs, False
                out.append({"type": "runs", "runs": list(runs.values())})
            self._primed = True
            return out

    def since(self, seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Messages numbered above `seq`, oldest first."""
        return [(n, m) for n, m in self.messages if n > seq]

    def replay(self, seq: int | None) -> list[tuple[int, dict[str, Any]]]:
        """What a listener that has seen message `seq` (None: nothing) needs, oldest first, at
        most `REPLAY` messages: the messages after `seq` when they fit; else the latest cluster
        and runs snapshots and the newest other messages."""
        messages = list(self.messages)
        if seq is not None and seq <= self.seq:
            after = [(n, m) for n, m in messages if n > seq]
            if len(after) <= REPLAY and (not messages or messages[0][0] <= seq + 1):
                return after
        latest: dict[str, tuple[int, dict[str, Any]]] = {}
        rest: list[tuple[int, dict[str, Any]]] = []
        for n, m in messages:
            if m.get("type") in ("cluster", "runs"):
                latest[m["type"]] = (n, m)
            else:
                rest.append((n, m))
        keep = list(latest.values()) + rest[-(REPLAY - len(latest)) :]
        return sorted(keep, key=lambda item: item[0])

    def changed(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _wake(self) -> None:
        """Wake the listeners waiting for new messages (on the event loop's thread)."""
        event, self._changed = self.changed(), asyncio.Event()
        event.set()

    def ensure_poller(self) -> None:
        """Start the poller (on the running event loop) unless it runs already."""
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _poll_forever(self) -> None:
        loop = asyncio.get_running_loop()
        idle = 0
        while idle < 30:
            session = self._session
            try:
                messages = await loop.run_in_executor(None, self.poll)
            except LOST as exc:
                messages = []
                if session is not None:
                    self.lost(session, scrub(str(exc)))
            except Exception as exc:
                messages = [{"type": "error", "message": scrub(str(exc))}]
            for message in messages:
                self._publish(message)
            if messages:
                self._wake()
            idle = idle + 1 if self.listeners == 0 else 0
            await asyncio.sleep(self.poll_interval)
        self._poller = None

    async def run(self, fn: Callable[[], T]) -> T:
        """Call a blocking `Session` method in a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(None, fn)
