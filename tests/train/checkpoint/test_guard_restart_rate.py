"""The restarted runtime on Slurm or Kubernetes weighs the launch's estimate updated with the run's
own preemptions (`tgnb.train.rates`), and its ``CheckpointIntervalChosen`` says so: a real
`CheckpointGuard` on a real torch model (as test_guard_unit.py), started with the engine's
restart count over a run directory whose ``events.jsonl`` holds the attempts before."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tgnb.events import DRAIN_NOTICE, RUN_EXITED, RUN_STARTED, Event, parse_time, utcnow

from .test_guard_unit import make_guard  # noqa: F401  (the fixture)

AS_OF = utcnow() - timedelta(hours=2)
LAUNCHED = {
    "auto": True,
    "preemptions_per_hour": 0.5,
    "observed_preemptions_per_hour": 0.5,
    "preemptions_source": "checkpoint.auto weighs 0.5 preemptions per node-hour (...)",
    "preemptions_weight_hours": 1.0,
    "preemptions_as_of": AS_OF.strftime("%Y-%m-%dT%H:%M:%SZ"),
    "failures_per_hour": 3600.0,
}


@pytest.mark.parametrize("variable", ["SLURM_RESTART_COUNT", "TGNB_RESTART_COUNT"])
def test_a_restarted_guard_weighs_the_runs_own_preemptions(
    make_guard: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
) -> None:
    start = parse_time(LAUNCHED["preemptions_as_of"]) + timedelta(minutes=1)
    drained = start + timedelta(minutes=30)  # one attempt: half an hour, then a drain notice
    before = [
        Event(start, "run", RUN_STARTED, "", run="r", data={"pid": 1}),
        Event(drained, "run", DRAIN_NOTICE, "", run="r"),
        Event(drained, "run", RUN_EXITED, "", run="r", data={"exit_code": 75}),
    ]
    (tmp_path / "events.jsonl").write_text("".join(e.to_json() + "\n" for e in before))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TGNB_RESTART_COUNT", raising=False)
    first, _ = make_guard(run_dir=tmp_path / "first", **LAUNCHED)  # no restart: as launched
    assert first.policy.preemption_rate == 0.5
    monkeypatch.setenv(variable, "1")
    guard, _ = make_guard(run_dir=tmp_path, **LAUNCHED)
    expected = (0.5 * 1.0 + 1) / (1.0 + 0.5)  # 1 preemption in half an hour of the run
    assert guard.policy.preemption_rate == pytest.approx(expected)
    guard.schedule.step_time_s, guard.saver.stall_s, guard.saver.write_s = 0.01, 0.02, None
    guard.saver.last_step = 100
    guard.periodic_due(110)
    lines = (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()
    chosen = [json.loads(x) for x in lines if "CheckpointIntervalChosen" in x]
    assert len(chosen) == 1
    said = chosen[0]["message"]  # in words; the estimate's own line is in its data
    assert (  # (0.5 x 1 + 1) / (1 + 0.5) = 1
        ", 1 preemption with one (estimated from the preemptions seen on the cluster and this "
        "run's own)" in said
    ), said
    detail = chosen[0]["data"]["detail"]
    assert f"checkpoint.auto weighs {expected:.3g} preemptions per hour of the run" in detail
    assert "updated at restart 1 with this run's own 1 preemption(s) over 0.5 h" in detail
    assert chosen[0]["data"]["preemptions_per_hour"] == pytest.approx(expected)
    assert chosen[0]["data"]["source"] == "observed"
