"""A sweep as one object (issue 47 §2) on plain records: the run store keeps the sweep (a new
store on the same file, as a restarted kernel opens, reads it back), and its table, best run and
chart are read from run directories as the runtime writes them (``metrics.jsonl``,
``events.jsonl``). No engine and no emulator: the runs are records of a real `RunStore`."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tgnb.errors import NotFoundError, ValidationError
from tgnb.events import Event
from tgnb.notebook.sweep_view import SweepView, chart_svg
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState, Resources, RunSpec
from tgnb.runs.store import RunStore
from tgnb.runs.sweeps import (
    Curve,
    Sweep,
    best_of,
    best_run,
    metric_of,
    preemption_steps,
    row_of,
    series,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _ev(seconds: float, reason: str, **data: int) -> Event:
    return Event(T0 + timedelta(seconds=seconds), "run", reason, run="r", data=data)


def test_the_best_value_is_the_largest_reward_or_the_smallest_loss() -> None:
    rows = [{"step": 1, "reward": 0.2, "loss": 3.0}, {"step": 2, "reward": 0.9, "loss": 1.0}]
    assert metric_of(rows, None) == ("reward", "max")
    assert metric_of([{"step": 1, "loss": 2.0}], None) == ("loss", "min")
    assert metric_of([{"step": 1, "lr": 2.0}], None) == (None, "max")
    assert metric_of(rows, "loss") == ("loss", "max")  # a named metric: its mode is the sweep's
    assert best_of(series(rows, "reward"), "max") == (0.9, 2)
    assert best_of(series(rows, "loss"), "min") == (1.0, 2)
    assert best_of([(1, 0.5), (3, 0.5)], "max") == (0.5, 1)  # the earliest on a tie
    assert best_of([], "max") == (None, None)
    # not numbers, NaN and a step that is not a whole number are passed over
    odd = [
        {"step": 1, "reward": "x"},
        {"step": 2, "reward": float("nan")},
        {"step": 1.5, "reward": 3},
    ]
    assert series(odd, "reward") == []


def test_a_preemption_is_placed_at_its_step_or_after_the_last_step_logged() -> None:
    at = (T0 + timedelta(seconds=10)).timestamp()
    rows = [{"step": s, "time": at + s} for s in range(1, 6)]
    events = [
        _ev(13.5, "DrainNoticeReceived"),  # no step of its own: step 3 was the last before it
        _ev(13.6, "SignalReceived", step=3),  # the same preemption, said by the program
        _ev(30, "SignalReceived", step=5),
        _ev(31, "CheckpointSaved", step=5),  # not a preemption
        _ev(0, "DrainNoticeReceived"),  # before any step
    ]
    assert preemption_steps(rows, events) == [0, 3, 5]


def test_a_row_says_state_steps_lost_cost_and_the_best_value() -> None:
    summary = {
        "run": "lr-1e-4",
        "state": "succeeded",
        "steps": 30,
        "max_steps": 30,
        "steps_lost": 1,
        "preemptions": 2,
        "restarts": 2,
        "cost_usd": 0.4213,
    }
    rows = [{"step": s, "reward": s / 10} for s in range(1, 31)]
    row = row_of(summary, rows)
    assert row.cells() == ("lr-1e-4", "succeeded", "30/30", "1", "2", "$0.42", "reward 3 @ step 30")
    unknown = row_of({**summary, "steps": None, "steps_lost": None, "cost_usd": None}, [])
    assert unknown.cells()[2:4] == ("?/30", "?") and unknown.cells()[-1] == "-"
    # a submitted function that logged nothing is read by the number it returned
    called = row_of({**summary, "max_steps": None}, [], result=0.25)
    assert (called.metric, called.best, called.cells()[-1]) == ("result", 0.25, "result 0.25")
    assert row_of(summary, [], result={"not": "a number"}).best is None
    assert best_run([row, called], None) == "lr-1e-4"
    assert best_run([row_of(summary, [{"step": 1, "loss": 2.0}]), called], None) == "lr-1e-4"
    loss_a = row_of({**summary, "run": "a"}, [{"step": 1, "loss": 2.0}])
    loss_b = row_of({**summary, "run": "b"}, [{"step": 1, "loss": 1.0}])
    assert best_run([loss_a, loss_b], None) == "b"  # a loss: the smallest
    assert best_run([loss_a, loss_b], "max") == "a"
    assert best_run([unknown], None) is None


def _record(
    store: RunStore, home: Path, name: str, rewards: list[float], preempt: int | None
) -> str:
    """A finished run with these rewards (one per step) and a preemption notice at `preempt`."""
    run_dir = home / "runs" / name
    run_dir.mkdir(parents=True)
    spec = RunSpec(name=name, train={"max_steps": len(rewards)}, resources=Resources(nodes=1))
    rec = store.create(spec, backend="local", cluster_id="c", run_dir=run_dir)
    store.set_state(rec.id, JobState.SUCCEEDED, "done")
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for step, reward in enumerate(rewards, 1):
            at = (T0 + timedelta(seconds=step)).timestamp()
            row = {"step": step, "reward": reward, "r<2>": 2 * reward, "time": at}
            fh.write(json.dumps(row) + "\n")
    with open(run_dir / "events.jsonl", "w") as fh:
        if preempt is not None:
            when = (T0 + timedelta(seconds=preempt + 0.5)).isoformat().replace("+00:00", "Z")
            notice = {"time": when, "source": "run", "reason": "SignalReceived", "run": name}
            fh.write(json.dumps({**notice, "data": {"step": preempt}}) + "\n")
    return rec.id


def test_a_sweep_is_kept_in_the_run_store_and_reads_back_as_one_table(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    a = _record(store, tmp_path, "grid-a", [0.1, 0.4, 0.3], preempt=2)
    b = _record(store, tmp_path, "grid-b", [0.2, 0.6, 0.9], preempt=None)
    store.record_sweep("grid", [a], cluster_id="c", source="grid")
    store.record_sweep("grid", [b, a])  # added after the runs it holds, once each
    again = RunStore(tmp_path)  # a restarted kernel's store, on the same file
    rec = again.sweep("grid")
    assert (rec.run_ids, rec.source, rec.cluster_id, rec.mode) == ((a, b), "grid", "c", "max")
    assert [s.name for s in again.sweeps(cluster_id="c")] == ["grid"]
    assert again.sweeps(cluster_id="other") == []

    sweep = Sweep(rec, again, lambda run: Run(again.get(run), again))
    assert len(sweep) == 2 and [r.name for r in sweep] == ["grid-a", "grid-b"]
    assert sweep[1].name == "grid-b" and [r.name for r in sweep[:1]] == ["grid-a"]
    rows = sweep.rows()
    assert [(r.run, r.best, r.best_step, r.preemptions) for r in rows] == [
        ("grid-a", 0.4, 2, 1),  # the program's notice: no engine metered these runs
        ("grid-b", 0.9, 3, 0),
    ]
    best = sweep.best()
    assert best is not None and best.run == "grid-b"
    curves = sweep.curves()
    assert curves[0] == Curve("grid-a", "succeeded", "reward", ((1, 0.1), (2, 0.4), (3, 0.3)), (2,))
    assert curves[1].preemptions == ()
    assert sweep.headline() == "sweep grid: 2 runs (2 succeeded)"
    text = sweep.table_text()
    assert text.splitlines()[1].split() == [
        "RUN",
        "STATE",
        "STEPS",
        "LOST",
        "PREEMPTIONS",
        "COST",
        "BEST",
    ]
    assert "reward 0.9 @ step 3" in text
    assert str(sweep) == text  # print(sweep) in a script
    assert sweep.stop() == []  # every run finished: nothing to stop

    view = SweepView(sweep)._repr_html_()
    assert view.count("<tr data-run=") == 2 and "★ reward 0.9 @ step 3" in view
    assert view.count('class="preemption"') == 1 and "grid-a: preempted at step 2" in view
    assert "%tg sweep grid --stop" in view

    named = Sweep(again.record_sweep("grid", metric="r<2>", mode="min"), again, sweep._open)
    assert [(r.metric, r.best) for r in named.rows()] == [("r<2>", 0.2), ("r<2>", 0.4)]
    assert named.best() == named.rows()[0]  # the smallest, as the sweep now says
    html = named._repr_html_()
    assert "r&lt;2&gt; 0.2 @ step 1" in html and "r<2>" not in html
    assert "r<2> 0.2 @ step 1" in named.table_text()  # text: as it is

    store.delete(a)  # a run forgotten leaves its sweeps
    assert again.sweep("grid").run_ids == (b,)


def test_bad_sweeps_are_refused_with_the_fix(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for bad in ("  ", "Grid", "a/b", "x" * 65):
        with pytest.raises(ValidationError, match=r"^sweep name .* is not valid: .*'lr-grid'$"):
            store.record_sweep(bad)
    with pytest.raises(ValidationError, match=r"metric must be a metric's name, got ''"):
        store.record_sweep("s", metric="")
    with pytest.raises(ValidationError, match=r"mode must be 'max' or 'min', got 'best'"):
        store.record_sweep("s", mode="best")
    with pytest.raises(NotFoundError, match=r"no run named 'nope'"):
        store.record_sweep("s", ["nope"])
    assert store.find_sweep("s") is None  # nothing recorded by a refusal
    store.record_sweep("first")
    with pytest.raises(
        NotFoundError, match=r"no sweep named 'x' .*\(sweeps: first\).*session\.sweeps\(\)"
    ):
        store.sweep("x")


def test_the_chart_draws_every_curve_and_its_preemptions_escaped() -> None:
    curves = [
        Curve("a<script>", "running", "reward", ((1, 0.1), (2, 0.5)), (2,)),
        Curve("b", "succeeded", "reward", ((1, 0.3),), ()),
        Curve("c", "pending", None, (), ()),
    ]
    svg = chart_svg(curves)
    assert svg.count('class="series"') == 2  # a line and a point; nothing yet for c
    assert svg.count('class="preemption"') == 1 and "preempted at step 2" in svg
    assert "<script>" not in svg and "a&lt;script&gt;" in svg
    assert svg.count('class="legend"') == 3 and "c · pending" in svg
    assert "no metrics yet" in chart_svg([Curve("c", "pending", None, (), ())])
