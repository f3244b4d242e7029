"""A sweep as one object: a named group of runs recorded in the run store (`RunStore.record_sweep`),
so a later kernel opens it again (``session.sweep(name)``) with one table, one chart and one stop.

A sweep comes from ``session.map(fn, items)`` (one run per item), from a grid of launches
(``session.sweep("lr-grid", [session.launch(..., learning_rate=lr) for lr in lrs])``) or from
papermill notebooks run as a batch (``tgnb notebooks run ... --sweep NAME``: every run their
kernels launch joins it). `Sweep` is a sequence of its `tgnb.runs.Run` s, so what takes a list of
runs takes a sweep (`tgnb.sweep.wait`, its budget).

Per run the table says its state, steps against max_steps, steps lost to restarts, preemptions,
dollars so far (`Run.summary`) and the best value of the sweep's metric and the step it was
reached at (`best_of`): the metric is the one the sweep was given, else the first reward key the
run logs (the largest is best), else its loss (the smallest); a submitted function that logs no
metric and returned a number is read by that number (``result``). `curves` gives each run's metric
against the step and the steps where a preemption hit it, for the chart
(`tgnb.notebook.sweep_view`, which ``%load_ext tgnb`` makes a sweep's rendering in the notebook).
The functions over plain rows (`best_of`, `preemption_steps`, `row_of`) do no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from tgnb.events import DRAIN_NOTICE, SIGNAL_RECEIVED, Event
from tgnb.markup import escape
from tgnb.prices import dollars
from tgnb.runs.store import RunStore
from tgnb.runs.sweepstore import SweepRecord

if TYPE_CHECKING:
    from tgnb.runs.run import Run

#: The metrics read when the sweep names none: a reward (largest best), else a loss (smallest).
REWARD_KEYS = ("reward", "rewards/margins", "train/reward", "rewards/chosen")
LOSS_KEYS = ("loss", "train/loss")
#: The metric name of a submitted function's returned number.
RESULT = "result"
#: The engine's and the program's word for a preemption notice.
PREEMPTION_REASONS = (DRAIN_NOTICE, SIGNAL_RECEIVED)


@dataclass(frozen=True)
class SweepRow:
    """One run of a sweep as its table shows it (None: not known)."""

    run: str
    state: str
    steps: int | None
    max_steps: int | None
    lost: int | None
    preemptions: int
    restarts: int
    cost_usd: float | None
    metric: str | None
    best: float | None
    best_step: int | None
    note: str | None = None

    def cells(self) -> tuple[str, ...]:
        """The row in words: run, state, steps, lost, preemptions, cost, best."""
        steps = "?" if self.steps is None else str(self.steps)
        if self.max_steps:
            steps = f"{steps}/{self.max_steps}"
        best = "-"
        if self.best is not None:
            at = f" @ step {self.best_step}" if self.best_step is not None else ""
            best = f"{self.metric} {self.best:.4g}{at}"
        return (
            self.run,
            self.state,
            steps,
            "?" if self.lost is None else str(self.lost),
            str(self.preemptions),
            dollars(self.cost_usd),
            best,
        )


#: The table's columns, as `SweepRow.cells` fills them.
HEAD = ("RUN", "STATE", "STEPS", "LOST", "PREEMPTIONS", "COST", "BEST")


def metric_of(rows: Sequence[Mapping[str, Any]], metric: str | None) -> tuple[str | None, str]:
    """The metric read from `rows` and how (``"max"``/``"min"``): `metric` when given (largest
    best), else the first reward key they hold, else a loss key, else (None, "max")."""
    if metric:
        return metric, "max"
    for keys, mode in ((REWARD_KEYS, "max"), (LOSS_KEYS, "min")):
        for key in keys:
            if any(_number(r.get(key)) is not None for r in rows):
                return key, mode
    return None, "max"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series(rows: Sequence[Mapping[str, Any]], key: str | None) -> list[tuple[int, float]]:
    """(step, value) of `key` in metric rows, by step."""
    if key is None:
        return []
    pts = [
        (int(r["step"]), v)
        for r in rows
        if isinstance(r.get("step"), int) and (v := _number(r.get(key))) is not None
    ]
    return sorted(pts)


def best_of(points: Sequence[tuple[int, float]], mode: str) -> tuple[float | None, int | None]:
    """The best value of `points` (largest for ``"max"``, smallest for ``"min"``; the earliest
    step on a tie) and its step; (None, None) for no points."""
    if not points:
        return None, None
    sign = -1.0 if mode == "max" else 1.0
    step, value = min(points, key=lambda p: (sign * p[1], p[0]))
    return value, step


def preemption_steps(rows: Sequence[Mapping[str, Any]], events: Iterable[Event]) -> list[int]:
    """The steps where preemption notices hit a run: the step the event names, else the last
    step the run logged before it (0 before any); one per step."""
    timed = sorted(
        (float(r["time"]), int(r["step"]))
        for r in rows
        if isinstance(r.get("step"), int) and _number(r.get("time")) is not None
    )
    out: set[int] = set()
    for e in events:
        if e.reason not in PREEMPTION_REASONS:
            continue
        step = e.data.get("step") if e.data else None
        if not isinstance(step, int) or isinstance(step, bool):
            t = e.time.timestamp()
            step = max((s for ts, s in timed if ts <= t), default=0)
        out.add(step)
    return sorted(out)


def row_of(
    summary: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    metric: str | None = None,
    mode: str | None = None,
    result: Any = None,
) -> SweepRow:
    """A run's table row from its `Run.summary` and metric rows; `result`: what its submitted
    function returned (read when it logs no metric and returned a number)."""
    key, auto = metric_of(rows, metric)
    value, step = best_of(series(rows, key), mode or auto)
    if value is None and not metric and _number(result) is not None:
        key, value, step = RESULT, _number(result), None
    return SweepRow(
        run=str(summary["run"]),
        state=str(summary["state"]),
        steps=summary.get("steps"),
        max_steps=summary.get("max_steps"),
        lost=summary.get("steps_lost"),
        preemptions=int(summary.get("preemptions") or 0),
        restarts=int(summary.get("restarts") or 0),
        cost_usd=summary.get("cost_usd"),
        metric=key if value is not None else None,
        best=value,
        best_step=step,
        note=summary.get("note"),
    )


def best_run(rows: Sequence[SweepRow], mode: str | None) -> str | None:
    """The name of the run with the best value: the largest for ``"max"``, the smallest for
    ``"min"`` (None: the smallest of a loss, else the largest); the first on a tie."""
    have = [r for r in rows if r.best is not None]
    if not have:
        return None
    low = (mode or ("min" if have[0].metric in LOSS_KEYS else "max")) == "min"
    return min(have, key=lambda r: (r.best or 0.0) if low else -(r.best or 0.0)).run


@dataclass(frozen=True)
class Curve:
    """One run's line of the sweep's chart: its metric against the step and where preemptions
    hit it."""

    run: str
    state: str
    metric: str | None
    points: tuple[tuple[int, float], ...]
    preemptions: tuple[int, ...]


class Sweep(Sequence["Run"]):
    """A sweep: its runs in order (``sweep[0]``, ``len(sweep)``, ``for run in sweep``), one
    table (`rows`), one chart's data (`curves`), one `stop`, one `wait`. Opened from the run
    store each time it is read, so two kernels show the same sweep."""

    def __init__(self, record: SweepRecord, store: RunStore, open_run: Callable[[str], Run]):
        self._record = record
        self._store = store
        self._open = open_run

    @property
    def name(self) -> str:
        return self._record.name

    @property
    def record(self) -> SweepRecord:
        """The store's record of the sweep, as last read (`refresh`)."""
        return self._record

    def refresh(self) -> SweepRecord:
        self._record = self._store.sweep(self.name)
        return self._record

    @property
    def runs(self) -> list[Run]:
        return [self._open(i) for i in self._record.run_ids]

    def __len__(self) -> int:
        return len(self._record.run_ids)

    @overload
    def __getitem__(self, i: int) -> Run: ...
    @overload
    def __getitem__(self, i: slice) -> list[Run]: ...
    def __getitem__(self, i: int | slice) -> Run | list[Run]:
        if isinstance(i, slice):
            return [self._open(x) for x in self._record.run_ids[i]]
        return self._open(self._record.run_ids[i])

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

    def add(self, runs: Iterable[Run]) -> Sweep:
        """Add `runs` to the sweep (recorded at once); the sweep."""
        self._record = self._store.record_sweep(self.name, [r.id for r in runs])
        return self

    # -- the table and the chart ---------------------------------------------------------------

    def rows(self) -> list[SweepRow]:
        """One `SweepRow` per run, in order."""
        return [self._row(r) for r in self.runs]

    def _row(self, run: Run) -> SweepRow:
        from tgnb.runs.call import is_call, outcome

        rows = run.records("metrics")
        summary = run.summary()
        result = None
        if summary["state"] == "succeeded" and is_call(run.record.spec.train) and not rows:
            out = outcome(run)
            if out is not None and out.get("kind") == "value":
                import pickle

                try:
                    result = pickle.loads(out["pickle"])
                except Exception:  # a value that cannot be read back here: no number to show
                    result = None
        return row_of(summary, rows, metric=self._record.metric, mode=self.mode, result=result)

    def curves(self) -> list[Curve]:
        """Each run's metric against the step and its preemptions' steps, in order."""
        out = []
        for run in self.runs:
            rows = run.records("metrics")
            key, _ = metric_of(rows, self._record.metric)
            out.append(
                Curve(
                    run.name,
                    run.report().state.value,
                    key,
                    tuple(series(rows, key)),
                    tuple(preemption_steps(rows, run.run_events())),
                )
            )
        return out

    @property
    def mode(self) -> str | None:
        """``"max"``/``"min"`` for the metric the sweep names; None: read from the metric."""
        return self._record.mode if self._record.metric else None

    def best(self) -> SweepRow | None:
        """The run with the best metric (`best_run`), or None while none has one."""
        rows = self.rows()
        name = best_run(rows, self.mode)
        return next((r for r in rows if r.run == name), None)

    def counts(self) -> dict[str, int]:
        """How many runs are in each state."""
        out: dict[str, int] = {}
        for run in self.runs:
            state = run.report().state.value
            out[state] = out.get(state, 0) + 1
        return out

    # -- acting on every run -------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop every unfinished run (each checkpoints, as `Run.stop`); the names of those asked."""
        asked = []
        for run in self.runs:
            if not run.refresh().state.finished:
                run.stop()
                asked.append(run.name)
        return asked

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> list[SweepRow]:
        """Wait until every run has finished; the table's rows. `TimeoutError` after `timeout`
        s (the runs go on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not all(r.sync().state.finished for r in self.runs):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"sweep {self.name!r} is still running after {timeout:g} s: "
                    "sweep.wait() again, or sweep.stop()"
                )
            time.sleep(poll)
        return self.rows()

    def results(self, timeout: float | None = None) -> list[Any]:
        """What each run's submitted function returned, in order (`Run.result`: the first
        exception raised again)."""
        return [run.result(timeout=timeout) for run in self.runs]

    # -- what a cell shows -----------------------------------------------------------------------

    def headline(self, rows: Sequence[SweepRow] | None = None) -> str:
        """``sweep NAME: 4 runs (2 running, 2 succeeded)`` (the states of `rows` when given,
        read once already)."""
        if rows is None:
            states = self.counts()
        else:
            states = {}
            for r in rows:
                states[r.state] = states.get(r.state, 0) + 1
        counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        n = len(self)
        return f"sweep {self.name}: {n} run{'s' * (n != 1)}" + (f" ({counts})" if counts else "")

    def table_text(self, rows: Sequence[SweepRow] | None = None) -> str:
        rows = self.rows() if rows is None else rows
        cells = [HEAD, *(r.cells() for r in rows)]
        widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() for c in cells
        ]
        return "\n".join([self.headline(rows), *lines])

    def __repr__(self) -> str:
        return f"<Sweep {self.name} runs={len(self)}>"

    def __str__(self) -> str:
        """The table, as a script's ``print(sweep)`` shows it."""
        return self.table_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.headline() if cycle else self.table_text())

    def _repr_html_(self) -> str:
        """The table alone (``%load_ext tgnb`` draws the chart under it: `tgnb.notebook.sweep_view`)."""
        rows = self.rows()
        head = "".join(f"<th>{escape(h.lower())}</th>" for h in HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r.cells()) + "</tr>" for r in rows
        )
        return (
            f"<div class='tgnb-sweep'><b>{escape(self.headline(rows))}</b><table class='tgnb-table'>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )


__all__ = [
    "HEAD",
    "Curve",
    "Sweep",
    "SweepRow",
    "best_of",
    "best_run",
    "metric_of",
    "preemption_steps",
    "row_of",
    "series",
]
