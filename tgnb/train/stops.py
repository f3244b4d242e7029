"""The stop-signal source: SIGTERM, SIGUSR1 or a drain notice becomes "stop requested".

::

    with StopSignals() as stops:           # installs the flag handlers, starts the drain watcher
        for step in ...:
            ...
            if stops.requested:            # checkpoint, then exit 75
                break

A signal (SIGTERM from Kubernetes, SIGUSR1 from Slurm's ``--signal``) only sets a flag, and so does
a drain notice (`tgnb.train.watcher`, on the node's first local rank): the program reads the flags
at a point of its choosing -- `tgnb.train.preemption.CheckpointGuard` at every optimizer-step
boundary, where every rank agrees on them. `close` gives back the handlers found at construction
and stops the watcher. `report` records ``SignalReceived`` / ``DrainNotice`` once each. Nothing
here imports torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from tgnb.events import DRAIN_NOTICE, SIGNAL_RECEIVED, format_time, parse_time
from tgnb.runs.policy import CheckpointPolicy
from tgnb.train.record import Recorder
from tgnb.train.watcher import DrainWatcher

__all__ = ["SIGNALS", "StopSignals"]

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_NOTICE_KEYS = ("node", "state", "path", "notice")


class StopSignals:
    """Flags set by SIGTERM / SIGUSR1 (`on_signal`) and by a drain notice (`watch_drain`, polled
    every `poll_seconds` on local rank 0); see the module docstring."""

    def __init__(
        self, on_signal: bool = True, watch_drain: bool = True, poll_seconds: float = 2.0
    ) -> None:
        self.on_signal = on_signal
        self.signal_received: tuple[int, float] | None = None
        self.drain_notice: tuple[str, dict[str, Any], float] | None = None
        self._previous: dict[int, Any] = {}
        self._reported: set[str] = set()
        self._watcher: DrainWatcher | None = None
        if on_signal:
            for sig in SIGNALS:
                with contextlib.suppress(ValueError):  # not the main thread
                    self._previous[sig] = signal.signal(sig, self._on_signal)
        if watch_drain and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            self._watcher = DrainWatcher(self._on_drain_notice, poll_seconds).start()

    @classmethod
    def for_policy(cls, policy: CheckpointPolicy) -> StopSignals:
        """The source `policy` asks for (``on_signal``, ``watch_drain``, ``drain_poll_seconds``)."""
        return cls(policy.on_signal, policy.watch_drain, policy.drain_poll_seconds)

    def __enter__(self) -> StopSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- flags, set from a signal handler or the watcher thread ------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signal_received is None:
            self.signal_received = (signum, time.time())

    def _on_drain_notice(self, source: str, details: dict[str, Any]) -> None:
        if self.drain_notice is None:
            self.drain_notice = (source, details, time.time())

    @property
    def requested(self) -> bool:
        """Whether a signal or a drain notice asked this process to stop."""
        return self.signal_received is not None or self.drain_notice is not None

    def request(self, reason: str = "signal", source: str = "request") -> None:
        """Ask for a stop, as a signal (``"signal"``) or a drain notice (``"drain"``) would;
        `source` names who asked (``peer``: another rank, agreed at a step boundary)."""
        if reason == "drain":
            self._on_drain_notice(source, {})
        else:
            self._on_signal(int(signal.SIGTERM), None)

    def own(self) -> None:
        """Take SIGTERM and SIGUSR1 back from a framework that installed its own handlers over
        these (Lightning's ends training before anything is saved); `close` still gives back
        the handlers found at construction."""
        if self.on_signal:
            for sig in SIGNALS:
                with contextlib.suppress(ValueError):  # not the main thread
                    signal.signal(sig, self._on_signal)

    def stop_watcher(self) -> None:
        """Stop the drain watcher (the run is over: no notice can matter any more)."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def close(self) -> None:
        """Stop the drain watcher and give the signal handlers back."""
        self.stop_watcher()
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous.clear()

    def report(self, recorder: Recorder, step: int) -> None:
        """Record ``SignalReceived`` and ``DrainNotice`` for the flags set, once each."""
        if self.signal_received:
            signum, at = self.signal_received
            name = signal.Signals(signum).name
            said = f"{name}: checkpoint at step {step} and exit"
            self._once(recorder, SIGNAL_RECEIVED, said, at, step, signal=name)
        if self.drain_notice:
            source, details, at = self.drain_notice
            said = f"drain notice ({source}): checkpoint at step {step} and exit"
            kept = {k: v for k, v in details.items() if k in _NOTICE_KEYS}
            self._once(recorder, DRAIN_NOTICE, said, at, step, via=source, **kept)

    def _once(
        self, recorder: Recorder, reason: str, said: str, at: float, step: int, **data: Any
    ) -> None:
        if reason not in self._reported:
            self._reported.add(reason)
            received = format_time(parse_time(at))
            recorder.event(reason, said, **data, received_at=received, step=step)
