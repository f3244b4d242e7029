"""`Run.summary()["steps_lost"]` read from a run directory as the runtime writes it
(``metrics.jsonl``, ``events.jsonl``): what each restart did not resume is lost."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.certify import report
from tgnb.certify.chaos import Fired
from tgnb.events import Event
from tgnb.runs.cost import run_cost
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore
from tgnb.runs.summary import attempts, last_step, spending, summarize

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _at(s: float) -> str:
    return (T0 + timedelta(seconds=s)).isoformat().replace("+00:00", "Z")


def _run(
    tmp_path: Path, events: list[tuple[float, str, dict[str, int]]], rows: list[tuple[int, float]]
) -> Run:
    """A finished run with these events and metrics rows ``(step, seconds)``."""
    store = RunStore(tmp_path / "home")
    spec = RunSpec(name="r", train={"max_steps": 12}, resources=Resources(nodes=1))
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    rec = store.create(spec, backend="local", cluster_id="c", run_dir=run_dir)
    store.set_state(rec.id, JobState.SUCCEEDED, "done")
    with open(run_dir / "events.jsonl", "w") as fh:
        for t, reason, data in events:
            row = {"time": _at(t), "source": "run", "reason": reason, "run": "r", "data": data}
            fh.write(json.dumps(row) + "\n")
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for step, t in rows:
            at = (T0 + timedelta(seconds=t)).timestamp()
            fh.write(json.dumps({"step": step, "loss": 1.0, "time": at}) + "\n")
    return Run(store.get(rec.id), store)


def test_a_restart_from_step_0_loses_every_step_done_before(tmp_path: Path) -> None:
    """The node was removed with no notice and no checkpoint yet: the second start trained
    from scratch, and the 7 steps of the first are lost (the summary said 0: no RunResumed)."""
    events = [(0, "RunStarted", {}), (20, "RunStarted", {}), (40, "RunExited", {})]
    first = [(k, k) for k in range(1, 8)]  # steps 1-7 at 1-7 s
    again = [(k, 20 + k) for k in range(1, 13)]  # steps 1-12 again from 21 s
    assert _run(tmp_path, events, first + again).summary()["steps_lost"] == 7


def test_a_resumed_restart_loses_only_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    events = [
        (0, "RunStarted", {}),
        (20, "RunStarted", {}),
        (21, "RunResumed", {"step": 5}),
        (40, "RunExited", {}),
    ]
    first = [(k, k) for k in range(1, 8)]
    resumed = [(k, 20 + k) for k in range(6, 13)]  # from checkpoint-5: steps 6 and 7 done twice
    assert _run(tmp_path, events, first + resumed).summary()["steps_lost"] == 2


def test_a_restart_that_trained_nothing_loses_nothing(tmp_path: Path) -> None:
    """Requeued after its last save: the restart found the run finished and trained no step."""
    events = [(0, "RunStarted", {}), (20, "RunStarted", {}), (21, "RunExited", {})]
    rows = [(k, k) for k in range(1, 13)]
    assert _run(tmp_path, events, rows).summary()["steps_lost"] == 0


def _plain(events: list[tuple[float, str, dict[str, int]]]) -> list[Event]:
    return [
        Event(time=T0 + timedelta(seconds=t), source="run", reason=reason, run="r", data=data)
        for t, reason, data in events
    ]


def test_the_summary_and_certify_count_the_same_attempts_on_plain_lists() -> None:
    """`tgnb.runs.summary.attempts` on plain lists (no run, no file): the summary sums the
    restarts' losses, `tgnb certify` reads the one after each event it fired; both agree."""
    events = _plain(
        [
            (0, "RunStarted", {}),
            (20, "RunStarted", {}),
            (21, "RunResumed", {"step": 5}),
            (40, "RunStarted", {}),
            (60, "RunExited", {}),
        ]
    )
    at = (T0 + timedelta(seconds=1)).timestamp()
    rows = [{"step": k, "time": at + k} for k in range(1, 8)]  # 1-7 before the first restart
    rows += [{"step": k, "time": at + 14 + k} for k in range(6, 10)]  # 6-9 after resuming at 5
    rows += [{"step": k, "time": at + 40 + k} for k in range(1, 4)]  # 1-3: from scratch at 40
    found = attempts(rows, events)
    assert [(a.before, a.resumed, a.lost) for a in found] == [(0, None, 0), (7, 5, 2), (9, None, 9)]
    assert [a.trained for a in found] == [True, True, True]
    cost = run_cost("r", events, 8)
    summary = summarize(
        "r", "succeeded", rows, events, cost, max_steps=12, restarts=2, kind="sft",
        spending=spending(cost, None, None),
    )  # fmt: skip
    assert summary["steps_lost"] == 2 + 9
    fired = Fired("kill", "a kill", fired_at=(T0 + timedelta(seconds=30)).timestamp())
    assert report.steps_lost(fired, rows, events) == (9, 9)
    assert report.steps_lost(Fired("kill", "not done"), rows, events) is None
    # 8 GPUs from the first start to the exit, 60 s: no price known, no dollars
    assert summary["gpu_hours"] == round(8 * 60 / 3600, 4) and summary["cost_usd"] is None


def test_the_last_step_is_none_only_for_a_program_that_reports_none() -> None:
    """The server's progress (`tgnb.server.serialize`) on plain lists: the last step logged;
    before any, 0 for a step loop tgnb knows, None for a script with no hook of tgnb's."""
    started = _plain([(0, "RunStarted", {})])
    rows = [{"step": 3, "time": 1.0}, {"step": 7, "time": 2.0}, {"step": "x"}]
    assert last_step(rows, [], script=True) == 7
    assert last_step([], started, script=True) == 0
    assert last_step([], [], script=False) == 0
    assert last_step([], [], script=True) is None
