"""Checkpoint the last step boundary the moment a preemption notice arrives, while the step in
progress is still computing (single process).

Between two optimizer steps -- during the forward and backward passes of the next one -- the
weights, the optimizer and the scheduler do not change: they still are the state of the last step
boundary. So when SIGTERM (or a drain notice) arrives mid-step, that state can be written at once,
instead of after the step in progress ends. The step in progress is then abandoned (at most one
step's compute is lost, never a step's result: nothing of it was applied or logged), and a resume
recomputes it from the same data position and RNG states.

The parts:

- `Gate`: the main thread is *in update* from ``on_pre_optimizer_step`` to the next
  ``on_step_begin`` (optimizer and scheduler step, ``global_step`` advances, logs, periodic saves);
  a snapshot may only run outside it, and the main thread does not enter it while one runs.
- `ImmediateSaver`: a thread woken by the signal itself -- ``signal.set_wakeup_fd`` makes
  CPython's C-level handler write the signal number to a socket at delivery, whatever the main
  thread is doing; our Python handler still only sets a flag -- or by the drain watcher. It waits
  for the gate, writes the boundary's checkpoint through the guard, and marks itself done; the
  main thread, at its next callback, raises `Preempted` to leave the training loop.

When the wakeup fd is taken (an event loop in the main thread owns it) the thread polls the
guard's flags every `POLL_S` instead. Without a boundary yet (the first step of a process), the
saver leaves the work to the step-boundary path.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

__all__ = ["POLL_S", "SIGNALS", "SWITCH_S", "Gate", "ImmediateSaver", "Preempted"]

POLL_S = 0.05
#: Signals that ask for checkpoint-and-exit (SIGUSR1: what Slurm's ``--signal`` can send).
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: The GIL switch interval while a snapshot is written (Python's default is 0.005 s).
SWITCH_S = 0.0001
_POKE = b"\0"


class Preempted(BaseException):
    """Raised in the training loop once a mid-step checkpoint is complete: the step in progress
    is abandoned and the run exits as preempted. A BaseException, so no ``except Exception`` in
    between swallows it."""


def yield_cpu(tids: Collection[int]) -> None:
    """Lower the CPU priority of the threads `tids` (native ids) of this process to the lowest,
    so the step being abandoned does not slow the checkpoint down. Not undone: the process exits
    once the checkpoint is written (raising it back needs privileges)."""
    for tid in tids:
        with contextlib.suppress(OSError):  # gone, or not Linux
            os.setpriority(os.PRIO_PROCESS, tid, 19)


class Gate:
    """Who may touch the training state: the main thread's update section, or one snapshot."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._in_update = False
        self._busy = False
        self._closed = False

    @property
    def in_update(self) -> bool:
        return self._in_update

    def enter_update(self) -> None:
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._in_update = True

    def leave_update(self) -> None:
        with self._cond:
            self._in_update = False
            self._cond.notify_all()

    def begin(self) -> bool:
        """Wait until the main thread is out of its update section; False once closed."""
        with self._cond:
            while self._in_update and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._busy = True
            return True

    def end(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ImmediateSaver:
    """The thread that writes a checkpoint of the last boundary as soon as it is told to stop.

    `snapshot(reason)` (the guard's) writes and seals the checkpoint and returns True, or returns
    False when there is no boundary to write yet. `signals` are the signal numbers that mean
    "preempted"; `reason_of()` returns "signal", "drain" or None from the guard's flags.
    """

    def __init__(
        self,
        snapshot: Callable[[str], bool],
        can_snapshot: Callable[[], bool],
        on_signal: Callable[[int], None],
        reason_of: Callable[[], str | None],
        signals: tuple[int, ...],
    ) -> None:
        self.gate = Gate()
        self._main_tid = threading.main_thread().native_id
        self._grad_hooks: list[Any] = []
        self._snapshot = snapshot
        self._can_snapshot = can_snapshot
        self._on_signal = on_signal
        self._reason_of = reason_of
        self._signals = {int(s) for s in signals}
        self.triggered = threading.Event()  # a stop was seen: a snapshot is coming or deferred
        self.finished = threading.Event()  # the attempt is over (done or deferred)
        self.done = False  # a checkpoint of the boundary is complete: leave the loop
        self._stop = False
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self.wakes_on_signal = False  # else it polls the guard's flags every POLL_S
        with contextlib.suppress(ValueError):  # not the main thread: poll
            old = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
            if old != -1:  # someone else's (an event loop's): give it back and poll
                signal.set_wakeup_fd(old)
            else:
                self.wakes_on_signal = True
        self._thread = threading.Thread(target=self._run, name="tgnb-immediate-save", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Wake the thread to look at the guard's flags (a drain notice, or closing)."""
        with contextlib.suppress(OSError):
            self._w.send(_POKE)

    def _wait(self) -> bytes:
        timeout = None if self.wakes_on_signal else POLL_S
        ready, _, _ = select.select([self._r], [], [], timeout)
        if not ready:
            return b""
        try:
            return self._r.recv(256)
        except (BlockingIOError, OSError):
            return b""

    def _run(self) -> None:
        while not self._stop:
            data = self._wait()
            for signum in data:
                if signum in self._signals:
                    self._on_signal(signum)
            if self._stop:
                return
            reason = self._reason_of()
            if reason is None:
                continue
            self.triggered.set()
            with contextlib.ExitStack() as stack:
                if self._can_snapshot():
                    stack.enter_context(self._main_thread_yields())
                try:
                    if self.gate.begin():
                        try:
                            self.done = self._snapshot(reason)
                        finally:
                            self.gate.end()
                except Exception as exc:  # the boundary path still saves; say why this failed
                    print(
                        f"tgnb: immediate checkpoint failed: {exc!r}", file=sys.stderr, flush=True
                    )
                finally:
                    self.finished.set()
            return

    @contextlib.contextmanager
    def _main_thread_yields(self) -> Iterator[None]:
        """While the snapshot is written, the step being abandoned must not compete with it: the
        GIL switch interval is short, so that the main thread, running Python between its ops,
        does not keep the GIL for up to 5 ms each time this thread needs it; the main thread
        stops at its next module call or gradient accumulation (`_hold`; `hold_on_grads`) and
        gets the lowest CPU priority (`yield_cpu`; the math library's threads work only when it
        dispatches to them, and listing them costs more than a tiny model's save gains)."""
        import torch.nn.modules.module as nn_module

        interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_S)
        collecting = gc.isenabled()
        gc.disable()  # a collection of the training process's heap could take longer than the save
        hook = nn_module.register_module_forward_pre_hook(self._hold)
        if self._main_tid is not None:
            yield_cpu([self._main_tid])
        try:
            yield
        finally:
            if collecting:
                gc.enable()
            sys.setswitchinterval(interval)
            hook.remove()

    def hold_on_grads(self, params: Iterable[Any]) -> None:
        """Also stop the main thread at the next gradient accumulated into one of `params`, so
        that a backward pass, which calls no module, does not run on beside the snapshot (each
        parameter's hook costs well under a microsecond per step until a snapshot is pending).
        Removed by `close`."""
        for p in params:
            if p.requires_grad:
                self._grad_hooks.append(p.register_post_accumulate_grad_hook(self._hold_grad))

    def _hold_grad(self, _param: Any) -> None:
        if self.triggered.is_set():
            self._hold(None, None)

    def _hold(self, module: Any, args: Any) -> None:
        """Forward pre-hook on every module while a snapshot is pending (and, through
        `_hold_grad`, a hook on each parameter's gradient): the main thread, outside its update
        section, waits here for the snapshot and leaves the loop once it is done."""
        if threading.current_thread() is not threading.main_thread() or self.gate.in_update:
            return
        self.finished.wait()
        if self.done:
            raise Preempted

    # -- what the main thread calls at its callbacks ------------------------------------------------
    def step_begin(self) -> None:
        """Out of the update section; leave the loop if a snapshot is done (or, triggered, once
        it is)."""
        self.gate.leave_update()
        if self.triggered.is_set():
            self.finished.wait()
        if self.done:
            raise Preempted

    def pre_optimizer_step(self) -> None:
        """Into the update section (after any snapshot in progress); leave the loop if done."""
        self.gate.enter_update()
        if self.done:
            self.gate.leave_update()
            raise Preempted

    def substep_end(self) -> None:
        if self.done:
            raise Preempted

    def close(self) -> None:
        """Stop the thread, remove the gradient hooks and give the wakeup fd back."""
        for handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks.clear()
        self._stop = True
        self.gate.close()
        self.poke()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        if self.wakes_on_signal:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)
            self.wakes_on_signal = False
        for sock in (self._r, self._w):
            with contextlib.suppress(OSError):
                sock.close()
