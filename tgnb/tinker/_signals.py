"""SIGTERM and SIGINT stop what a Tinker script holds, as its normal exit does.

A script stopped by ``kill``, ``timeout`` or a scheduler (SIGTERM) never runs its exit hooks, and
Ctrl-C (SIGINT) may land while a resource is provisioning. `install` (called when a
`ServiceClient` is made) sets a handler for each of the two signals, in the main thread only and
only where the program has not set its own (SIGTERM's default, SIGINT's `default_int_handler`).
The handler stops every resource the process created (force: their sessions too;
`_pool.stop_everything`, which takes no lock, so it cannot wait on the thread it interrupted),
prints the exit report when the signal will end the process, puts the previous handler back and
passes the signal on to it: SIGINT
still raises `KeyboardInterrupt`, SIGTERM still ends the process as it did (by the signal, exit
status -15). A second signal while the first is handled goes straight to the previous handler,
and so does one in a forked child of the script (a DataLoader worker inherits the handler, and
its SIGTERM must not stop its parent's resources).
SIGKILL cannot be caught: the registry and the inactivity timeout cover it (`tgnb.ptregistry`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from tgnb.tinker._pool import stop_everything

_previous: dict[int, Any] = {}
_installed_by: int | None = None  # the pid that set them (a forked child inherits them)


def _defaults(signum: int) -> tuple[Any, ...]:
    if signum == signal.SIGINT:
        return (signal.default_int_handler,)
    return (signal.SIG_DFL,)


def install() -> None:
    """Set the handlers (see the module docstring); nothing outside the main thread, nothing
    where the program set its own handler, nothing twice."""
    global _installed_by
    if threading.current_thread() is not threading.main_thread():
        return
    _installed_by = os.getpid()
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signum in _previous:
            continue
        current = signal.getsignal(signum)
        if current not in _defaults(signum):
            continue  # the program's own handler (or SIG_IGN) stays
        _previous[signum] = current
        signal.signal(signum, _handle)


def _handle(signum: int, frame: FrameType | None) -> None:
    previous = _previous.pop(signum, signal.SIG_DFL)
    signal.signal(signum, previous)  # a second signal goes straight to it
    if os.getpid() != _installed_by:  # a forked child (a DataLoader worker): not its resources
        _pass_on(previous, signum, frame)
        return
    # RuntimeError: the interrupted thread was inside a write to stderr (a reentrant call)
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        name = signal.Signals(signum).name
        print(
            f"tgnb.tinker: {name}: stopping this script's sessions and model resources",
            file=sys.stderr,
            flush=True,
        )
    try:
        stop_everything(report=previous == signal.SIG_DFL)
    finally:
        _pass_on(previous, signum, frame)


def _pass_on(previous: Any, signum: int, frame: FrameType | None) -> None:
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


__all__ = ["install"]
