"""`tgnb.train.immediate`: the snapshot starts when the signal is delivered, in its own thread, only
outside the main thread's update section; the main thread then leaves the loop with `Preempted`.

Real signals to this process; a recording function stands in for the checkpoint write (the real
one is exercised end to end in test_equivalence.py and bench/checkpoint.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tgnb.train import immediate
from tgnb.train.immediate import ImmediateSaver, Preempted


class Harness:
    def __init__(self, can: bool = True, write_s: float = 0.0, result: bool = True) -> None:
        self.flag: int | None = None
        self.calls: list[tuple[str, str, float]] = []
        self.write_s = write_s
        self.result = result
        self.yielded: list[int] = []
        self.saver = ImmediateSaver(
            self.snapshot, lambda: can, self.on_signal, self.reason, (signal.SIGTERM,)
        )

    def on_signal(self, signum: int) -> None:
        self.flag = signum

    def reason(self) -> str | None:
        return "signal" if self.flag is not None else None

    def snapshot(self, reason: str) -> bool:
        self.calls.append((reason, threading.current_thread().name, time.monotonic()))
        time.sleep(self.write_s)
        return self.result

    def wait_for_call(self, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while not self.calls and time.monotonic() < deadline:
            time.sleep(0.001)


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Installs a flag-only SIGTERM handler (the guard's kind), gives the old one back after.
    `yield_cpu` is recorded, not run: it would lower this test process's priority for good."""
    yielded: list[int] = []
    monkeypatch.setattr(immediate, "yield_cpu", lambda tids: yielded.append(1))
    made: list[Harness] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: None)

    def make(**kw: Any) -> Harness:
        h = Harness(**kw)
        h.yielded = yielded
        made.append(h)
        return h

    yield make
    for h in made:
        h.saver.close()
    signal.signal(signal.SIGTERM, previous)


def test_the_snapshot_starts_at_the_signal_while_the_step_computes(harness: Any) -> None:
    h = harness()
    assert h.saver.wakes_on_signal
    h.saver.step_begin()  # a step starts: out of the update section
    sent = time.monotonic()
    os.kill(os.getpid(), signal.SIGTERM)
    h.wait_for_call()  # the main thread is not at any callback meanwhile
    assert h.calls and h.calls[0][:2] == ("signal", "tgnb-immediate-save")
    assert h.calls[0][2] - sent < 1.0
    assert h.yielded  # the abandoned step was told to yield the CPU
    with pytest.raises(Preempted):
        h.saver.pre_optimizer_step()  # the step in progress is not applied


def test_no_snapshot_inside_the_update_section(harness: Any) -> None:
    h = harness()
    h.saver.step_begin()
    h.saver.pre_optimizer_step()  # optimizer step, scheduler, global_step, logs...
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)
    assert h.calls == []  # it waits for the main thread to leave the update section
    with pytest.raises(Preempted):
        h.saver.step_begin()  # leaves it, waits for the snapshot of this boundary, stops
    assert len(h.calls) == 1


def test_a_deferred_snapshot_leaves_training_to_the_step_boundary(harness: Any) -> None:
    h = harness(result=False)  # the guard's answer when there is no boundary yet
    h.saver.step_begin()
    os.kill(os.getpid(), signal.SIGTERM)
    assert h.saver.finished.wait(5)
    h.saver.pre_optimizer_step()  # no Preempted: the boundary path will save
    h.saver.step_begin()


def test_the_main_thread_waits_at_its_next_module_call_then_leaves(harness: Any) -> None:
    h = harness(write_s=0.4)
    layer = torch.nn.Linear(4, 4)
    h.saver.step_begin()
    os.kill(os.getpid(), signal.SIGTERM)
    h.wait_for_call()
    began = time.monotonic()
    with pytest.raises(Preempted):
        layer(torch.zeros(1, 4))  # the forward of the step being abandoned
    assert time.monotonic() - began > 0.2  # it waited for the write, not computing meanwhile
    h.saver.close()
    layer(torch.zeros(1, 4))  # the hook is gone once the snapshot is over
    assert sys.getswitchinterval() == pytest.approx(0.005)  # given back


def test_the_main_thread_waits_at_its_next_gradient_in_a_backward_then_leaves(
    harness: Any,
) -> None:
    h = harness(write_s=0.4)
    layer = torch.nn.Linear(4, 4)
    h.saver.hold_on_grads(layer.parameters())
    loss = layer(torch.ones(1, 4)).sum()  # the forward happened before the signal
    h.saver.step_begin()
    os.kill(os.getpid(), signal.SIGTERM)
    h.wait_for_call()
    began = time.monotonic()
    with pytest.raises(Preempted):
        loss.backward()  # the backward of the step being abandoned: it calls no module
    assert time.monotonic() - began > 0.2  # it waited for the write, not computing meanwhile
    h.saver.close()
    layer.zero_grad()
    layer(torch.ones(1, 4)).sum().backward()  # the hooks are gone with the saver
    assert layer.weight.grad is not None


def test_the_gradient_hooks_do_nothing_until_a_stop(harness: Any) -> None:
    h = harness()
    layer = torch.nn.Linear(4, 4)
    h.saver.hold_on_grads(layer.parameters())
    h.saver.step_begin()
    layer(torch.ones(1, 4)).sum().backward()
    assert layer.weight.grad is not None and h.calls == []
