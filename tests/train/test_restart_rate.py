"""At a restart on Slurm or Kubernetes, whose nodes hold no API key, the runtime folds the run's
own preemptions since the launch's estimate into it (`tgnb.train.rates`): on event files built by
hand, exact figures. (The launch's side, and the local engine's re-read of the cluster, are in
tests/cloud/test_restart_rates.py.)"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tgnb.events import (
    CHECKPOINT_SAVED,
    DRAIN_NOTICE,
    RUN_EXITED,
    RUN_STARTED,
    SIGNAL_RECEIVED,
    Event,
    parse_time,
)
from tgnb.runs import node
from tgnb.runs.policy import CheckpointPolicy
from tgnb.train import rates as node_rates

NOW = parse_time("2026-11-29T20:00:00Z")
#: What a launch on 2 nodes wrote: 0.273 per hour of the run, worth 5.5 h of it, as of NOW.
LAUNCHED = {
    "auto": True,
    "observed_preemptions_per_hour": 0.2727,
    "preemptions_source": "checkpoint.auto weighs 0.136 preemptions per node-hour (...)",
    "preemptions_weight_hours": 5.5,
    "preemptions_as_of": "2026-11-29T20:00:00Z",
}


def write_events(run_dir: Path, events: list[Event]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.writelines(e.to_json() + "\n" for e in events)


def run_ev(at: datetime, reason: str, **data: Any) -> Event:
    return Event(at, "run", reason, "", run="r", data=data)


def attempt(start: datetime, minutes: float, end: str | None, pid: int = 1) -> list[Event]:
    """One attempt: RunStarted, a save, then `end` (a signal or a drain notice and exit 75, or
    nothing: a process killed) after `minutes`."""
    out = [run_ev(start, RUN_STARTED, pid=pid)]
    out.append(run_ev(start + timedelta(minutes=minutes / 2), CHECKPOINT_SAVED, step=5))
    last = start + timedelta(minutes=minutes)
    if end is not None:
        out += [run_ev(last, end), run_ev(last, RUN_EXITED, exit_code=75)]
    else:
        out.append(run_ev(last, CHECKPOINT_SAVED, step=10))
    return out


def test_the_own_record_counts_the_attempts_since_the_estimate() -> None:
    events = attempt(NOW - timedelta(hours=1), 30, SIGNAL_RECEIVED)  # before the estimate
    events += attempt(NOW + timedelta(minutes=1), 30, SIGNAL_RECEIVED)  # Kubernetes: SIGTERM
    events += attempt(NOW + timedelta(minutes=40), 15, DRAIN_NOTICE)  # Slurm: a drain notice
    events += attempt(NOW + timedelta(minutes=60), 6, None)  # lost without notice: not counted
    events.append(Event(NOW + timedelta(minutes=70), "tgnb", "RunRequeued", ""))  # not the run's
    events += attempt(NOW + timedelta(minutes=80), 0, None, pid=os.getpid())  # this start
    seen = node_rates.own_record(events, NOW, pid=os.getpid())
    assert (seen.preemptions, seen.attempts) == (2, 3)
    assert seen.hours == pytest.approx((30 + 15 + 6) / 60)


def test_a_restart_folds_the_runs_own_preemptions_into_the_launch_estimate(
    tmp_path: Path,
) -> None:
    policy = CheckpointPolicy(**LAUNCHED)
    write_events(tmp_path, attempt(NOW + timedelta(minutes=5), 30, SIGNAL_RECEIVED))
    write_events(tmp_path, attempt(NOW + timedelta(minutes=40), 30, DRAIN_NOTICE))
    assert node_rates.at_restart(policy, tmp_path, 0) is policy  # the first start: as launched
    new = node_rates.at_restart(policy, tmp_path, 2)
    expected = (0.2727 * 5.5 + 2) / (5.5 + 1.0)  # 2 preemptions in 1 h of the run
    assert new.observed_preemptions_per_hour == pytest.approx(expected)
    assert new.preemption_rate > policy.preemption_rate  # more often than the cluster showed
    line = new.preemptions_source or ""
    assert line.startswith(f"checkpoint.auto weighs {expected:.3g} preemptions per hour")
    assert "updated at restart 2 with this run's own 2 preemption(s) over 1 h" in line
    assert line.endswith(
        "(the nodes read no cluster); at launch: " + LAUNCHED["preemptions_source"]
    )
    assert new.preemptions_weight_hours == pytest.approx(5.5 + 1.0)
    assert node_rates.at_restart(new, tmp_path, 2) is new  # folded already: nothing counted twice


def test_hours_without_a_preemption_bring_the_rate_down(tmp_path: Path) -> None:
    write_events(tmp_path, attempt(NOW + timedelta(minutes=5), 600, None))  # 10 h, then a crash
    new = node_rates.at_restart(CheckpointPolicy(**LAUNCHED), tmp_path, 1)
    assert new.observed_preemptions_per_hour == pytest.approx(0.2727 * 5.5 / (5.5 + 10))


def test_nothing_to_update_leaves_the_policy(tmp_path: Path) -> None:
    write_events(tmp_path, attempt(NOW + timedelta(minutes=5), 30, SIGNAL_RECEIVED))
    off = CheckpointPolicy(**{**LAUNCHED, "auto": False})
    assert node_rates.at_restart(off, tmp_path, 1) is off
    unestimated = CheckpointPolicy(auto=True)  # not launched on preemptible nodes: no estimate
    assert node_rates.at_restart(unestimated, tmp_path, 1) is unestimated
    newer = CheckpointPolicy(**{**LAUNCHED, "preemptions_as_of": "2026-11-29T21:00:00Z"})
    assert node_rates.at_restart(newer, tmp_path, 1) is newer  # the local engine's re-read


def test_the_restart_count_comes_from_the_engines_variable() -> None:
    assert node.restart_count({}) == 0
    assert node.restart_count({"TGNB_RESTART_COUNT": "0", "SLURM_RESTART_COUNT": "3"}) == 3
    assert node.restart_count({"TGNB_RESTART_COUNT": "2"}) == 2
    assert node.restart_count({"SLURM_RESTART_COUNT": "x"}) == 0
