"""The guard's two torch-free parts used alone, as a user's own loop would: `StopSignals` (a real
SIGUSR1 to this process, the real drain watcher on a real notice file) and `CheckpointSchedule`
(its rules on given step times: the clock is the only thing not measured here)."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.events import DRAIN_NOTICE
from tgnb.runs.policy import CheckpointPolicy
from tgnb.train import CheckpointSchedule, StopSignals
from tgnb.train.record import Recorder


def test_a_signal_or_a_drain_notice_requests_a_stop_and_close_gives_the_handlers_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with StopSignals(watch_drain=False) as stops:
        assert not stops.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # the process survives: the handler sets a flag
        wait_until(lambda: stops.requested, 5, what="the handler", every=0.01)
        assert stops.signal_received and stops.signal_received[0] == signal.SIGUSR1
        assert stops.drain_notice is None
    assert signal.getsignal(signal.SIGUSR1) == before
    notice = tmp_path / "preemption-notice.json"
    monkeypatch.setenv("TGNB_NOTICE_FILE", str(tmp_path))
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    with StopSignals(on_signal=False, poll_seconds=0.02) as stops:
        assert signal.getsignal(signal.SIGTERM) != stops._on_signal
        notice.write_text(json.dumps({"node": "n1"}))
        wait_until(lambda: stops.requested, 5, what="the drain notice", every=0.01)
        stops.report(Recorder(tmp_path), step=7)
        stops.report(Recorder(tmp_path), step=8)  # once
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    drains = [e["data"] for e in lines if e["reason"] == DRAIN_NOTICE]
    assert len(drains) == 1 and drains[0]["notice"] == {"node": "n1"} and drains[0]["step"] == 7


def test_the_schedule_alone_says_when_a_save_is_due() -> None:
    every = CheckpointSchedule(CheckpointPolicy(every_steps=5))
    assert [s for s in range(1, 16) if every.due(s, 0, None, None, lambda: 0)] == [5, 10, 15]
    auto = CheckpointSchedule(
        CheckpointPolicy(auto=True, preemptions_per_hour=3600.0, failures_per_hour=3600.0)
    )
    assert not auto.due(500, 0, 0.02, None, lambda: 0)  # no step timed yet: nothing to weigh
    auto.step_time_s = 0.01  # sqrt(2 x 0.02 + 0.02^2) s = 0.2 s = 20 steps (test_guard_unit)
    assert not auto.due(119, 100, 0.02, None, lambda: 0) and auto.due(120, 100, 0.02, None, int)
    sized = []
    auto.due(101, 100, None, None, lambda: sized.append(1) or 10**9)  # 1 s to stage: not tiny
    assert sized == [1] and auto.auto_steps(None, None, lambda: 10**9) > 20


def test_the_interval_in_force_is_never_longer_than_the_one_announced(tmp_path: Path) -> None:
    """The default policy (``auto``) over 6,000 steps whose save stall and step time jump every
    500 steps (a save measured, a slower data loader) and jitter by 10 % in between: each save
    step is at most the interval announced before it past the last save (what a kill then loses),
    and the jitter is never announced (only the jumps)."""
    rng = random.Random(7)
    recorder = Recorder(tmp_path)
    told: list[int] = []
    recorder.listeners.append(lambda _name, rec: told.append(rec["data"]["every_steps"]))
    schedule = CheckpointSchedule(CheckpointPolicy(), recorder)
    last, stall, base, gaps = 0, None, 0.25, []
    for step in range(1, 6001):
        if step % 500 == 0:
            stall = rng.choice([None, 0.001, 0.05, 0.5, 3.0])
            base = rng.uniform(0.05, 2.0)
        schedule.step_time_s = base * rng.uniform(0.95, 1.05)
        # a kill now loses the steps since the last save: at most the interval announced before
        assert not told or step - last <= told[-1], (step, last, told)
        if schedule.due(step, last, stall, stall, lambda: 10**7):
            gaps.append(step - last)
            last = step
    assert len(told) <= 2 * 6000 // 500 + 1, told  # the jumps, not the jitter
    assert len(set(gaps)) > 3 and len(told) > 5, (gaps, told)  # the interval did move
    lines = (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["data"]["every_steps"] for x in lines] == told
