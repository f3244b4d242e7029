"""`Run`: one training run as the notebook sees it, backed by the run store and its backend.

A `Run` holds no state of its own beyond what the run store has: build one from a store record at
any time (a fresh kernel does exactly that) and it shows the same run.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from tgnb.config import scrub
from tgnb.errors import BackendError, TgnbError
from tgnb.events import (
    BUDGET_NOTICE,
    BUDGET_REACHED,
    NODE_ADDED,
    PREEMPTED,
    RUN_EXITED,
    RUN_STARTED,
    Event,
    dedupe,
    from_record,
    metrics_row,
    parse_record,
    program_text,
)
from tgnb.runs import cursor, logtail
from tgnb.runs.backend import Backend
from tgnb.runs.cost import RunCost, run_cost
from tgnb.runs.node import LOG as TRAIN_LOG
from tgnb.runs.spec import JobState, JobStatus
from tgnb.runs.store import RunRecord, RunStore, StatusChange
from tgnb.runs.summary import closing_line, spending, summarize

if TYPE_CHECKING:
    import pandas as pd

    from tgnb.prices import Prices


class Run:
    """A launched run: status, metrics, events, logs; wait for it or stop it.

    `status` is the run's `JobStatus` (state, restart count, nodes, exit code, detail), as the
    backend reports it and the run store records it. `metrics()` reads ``metrics.jsonl`` from the
    run directory; `events()` merges the run's own events with the cluster's node events for the
    nodes it ran on.
    """

    def __init__(
        self,
        record: RunRecord,
        store: RunStore,
        backend: Backend | None = None,
        cluster: Any = None,
    ) -> None:
        self._record = record
        self.store = store
        self.backend = backend
        self.cluster = cluster

    # -- identity ------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def name(self) -> str:
        return self._record.name

    @property
    def record(self) -> RunRecord:
        """The run store's record, as of the last refresh."""
        return self._record

    @property
    def run_dir(self) -> Path | None:
        return Path(self._record.run_dir) if self._record.run_dir else None

    def __repr__(self) -> str:
        st = self.report()
        nodes = ",".join(st.nodes) or "-"
        return (
            f"<Run {self.name} {st.state.value} backend={self._record.backend} nodes={nodes} "
            f"restarts={st.restart_count}>"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """What a notebook cell shows for a run: a sentence, not the repr."""
        st = self.report()
        where = f" on {', '.join(st.nodes)}" if st.nodes else ""
        detail = f": {st.detail}" if st.detail and st.state.value != "succeeded" else ""
        p.text(
            f"run {self.name}: {st.state.value}{where} ({self._record.backend} engine), "
            f"{st.restart_count} restart{'s' * (st.restart_count != 1)}{detail}"
        )

    # -- status --------------------------------------------------------------------------------

    def refresh(self) -> RunRecord:
        """Read the run store's record again (a read: nothing is written)."""
        self._record = self.store.get(self._record.id)
        return self._record

    @property
    def status(self) -> JobStatus:
        """The run's status as its engine reports it (`Backend.status`: the truth for every
        engine), or as the store recorded it once the run has finished; a failed run's `detail`
        is its last error line (`error`). A read: the store is brought up to date by `sync`.

        Raises the engine's `tgnb.errors.TgnbError` (a `BackendError` for any other failure)
        when the engine cannot say.
        """
        rec = self.refresh()
        if self.backend is not None and not rec.state.finished:
            st = self._engine_status(rec)
        else:
            st = JobStatus(rec.state, rec.restart_count, rec.nodes, rec.exit_code, rec.detail)
        detail = (self.error() if st.state is JobState.FAILED else None) or st.detail
        return JobStatus(st.state, st.restart_count, st.nodes, st.exit_code, scrub(detail))

    def report(self) -> JobStatus:
        """`status` for a listing (a panel, a table): when the engine cannot say, its error is
        reported in the `detail` of an UNKNOWN status instead of raised."""
        try:
            return self.status
        except TgnbError as exc:
            rec = self._record
            return JobStatus(JobState.UNKNOWN, rec.restart_count, rec.nodes, None, str(exc))

    def _engine_status(self, rec: RunRecord) -> JobStatus:
        assert self.backend is not None
        try:
            return self.backend.status(rec.job_id or rec.id)
        except TgnbError:
            raise
        except Exception as exc:  # the engine's own library failed: typed, with its cause
            raise BackendError(
                f"the {self.backend.name} backend could not say how run {rec.name!r} is: {exc}"
            ) from exc

    def sync(self) -> JobStatus:
        """Bring the run store's record up to what the engine says, and return that status.

        The one place where the store follows the engine: `wait` calls it at each poll and
        `stop` after cancelling; call it (or `Session.sync`) to have listings such as
        `Session.runs` up to date. A change is recorded only if the record did not move on
        meanwhile (the local supervisor writes the same record), so nothing newer is undone.
        """
        rec = self.refresh()
        if self.backend is None or rec.state.finished:
            return self.status
        st = self._engine_status(rec)
        if st.state != rec.state or st.restart_count != rec.restart_count:
            self.store.set_state(
                rec.id,
                st.state,
                st.detail,
                nodes=st.nodes,
                restart_count=st.restart_count,
                exit_code=st.exit_code,
                expect=(rec.state, rec.restart_count),
            )
        return self.status if st.state.finished else st

    def error(self) -> str | None:
        """Why the run failed, in one line: tgnb's own message or the Python exception's line
        from the end of its log, else the failure its events recorded; None when not known.
        Secrets are masked (`tgnb.config.scrub`): the program may have printed one. None for a
        run that succeeded (a launcher's traceback after a preemption is no error of it)."""
        if self.refresh().state is JobState.SUCCEEDED:
            return None
        found = last_error(self.logs(raw=True))
        if found:
            return scrub(found)
        for ev in reversed(self.run_events()):
            if ev.reason == RUN_EXITED and ev.data.get("exit_reason") == "failed":
                return scrub(ev.message.removeprefix("failed: ")) or None
        return None

    def max_steps(self) -> int | None:
        """The steps the run will take: as its program reported them (``RunStarted``; a script's
        Trainer or loop), else its config's ``max_steps``."""
        for ev in reversed(self.run_events()):
            value = ev.data.get("max_steps") if ev.reason == RUN_STARTED else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return self._record.spec.train.planned_steps

    @property
    def state(self) -> JobState:
        """The run's state (`status`)."""
        return self.status.state

    @property
    def restart_count(self) -> int:
        """How many times the run was started again after a preemption (`status`)."""
        return self.status.restart_count

    def history(self) -> list[StatusChange]:
        """The run's status changes, oldest first."""
        return self.store.history(self.id)

    def wait(
        self, timeout: float | None = None, poll: float = 0.5, progress: bool = True
    ) -> JobStatus:
        """Block until the run has finished (succeeded, failed or cancelled); its final status.
        The run's watcher: each poll is a `sync`, so the store holds the final state on return.

        `progress` shows a text bar on stderr: steps done of max_steps, elapsed, ETA, state.
        A run with a ``budget_usd`` has its budget's notices (80 %, reached) printed on stderr;
        the budget itself is held beside the run, whether anything waits or not: by the local
        supervisor, or on Slurm and Kubernetes by the run's node (`tgnb.runs.budget`).
        Raises `TimeoutError` after `timeout` seconds with the run still going.
        """
        from tgnb.progress import StepBar

        deadline = None if timeout is None else time.monotonic() + timeout
        bar: StepBar | None = None
        read_at = -float("inf")  # the metrics are read at most every 2 s (remote ones are logs)
        step = 0
        told: set[str] = set()  # the budget's notices already printed
        try:
            while True:
                st = self.sync()
                if self._record.spec.budget_usd is not None:
                    self._tell_budget(told)
                if progress:
                    if st.state.finished or time.monotonic() - read_at >= 2.0:
                        step, read_at = self._last_step(), time.monotonic()
                    if bar is None:
                        bar = StepBar(self.name, self.max_steps(), step)
                    bar.update(step, st.state.value)
                if st.state.finished:
                    if bar is not None:  # the bar's last line, then what the run cost: a
                        bar.close()  # result, on stdout (a notebook shows no error block)
                        bar = None
                        print(self.closing_line(st), flush=True)
                    return st
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"run {self.name!r} is still {st.state.value} after {timeout:g} s "
                        f"({st.detail})"
                    )
                time.sleep(poll)
        finally:
            if bar is not None:
                bar.close()

    def closing_line(self, st: JobStatus | None = None) -> str:
        """One line on how the run ended and what it cost (`tgnb.runs.summary.closing_line`)."""
        st = st or self.report()
        return closing_line(self.name, st.state.value, st.detail, self.summary())

    def _tell_budget(self, told: set[str]) -> None:
        """Print on stderr each budget notice of the run's events not yet in `told`."""
        for ev in self.run_events():
            if ev.reason in (BUDGET_NOTICE, BUDGET_REACHED) and ev.reason not in told:
                told.add(ev.reason)
                print(f"run {self.name}: {ev.message}", file=sys.stderr, flush=True)

    def wait_for_step(
        self, step: int = 1, timeout: float | None = None, poll: float = 0.5
    ) -> JobStatus:
        """Block until the run runs on its nodes and has logged optimizer step `step` (or a
        later one), or has finished; its status then (finished: check ``state.finished``).
        Raises `TimeoutError` after `timeout` seconds with neither."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.sync()
            if st.state.finished:
                return st
            if st.state is JobState.RUNNING and st.nodes and self._last_step() >= step:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {self.name!r} has not trained step {step} after {timeout:g} s "
                    f"(it is {st.state.value}{': ' + st.detail if st.detail else ''})"
                )
            time.sleep(poll)

    def _last_step(self) -> int:
        """The highest optimizer step in the run's metrics so far (0 before the first)."""
        return max((int(r["step"]) for r in self.records("metrics") if "step" in r), default=0)

    def result(self, timeout: float | None = None) -> Any:
        """A submitted function's value (`tgnb.Session.submit`), once its run has ended: the
        function's exception raised again with the node's traceback in a note, a
        `tgnb.errors.CallError` when the run ended without either (`tgnb.runs.call.result`).
        Raises `TimeoutError` after `timeout` seconds with the run still going."""
        from tgnb.runs import call

        return call.result(self, timeout)

    def stop(self) -> None:
        """Stop the run: its processes get SIGTERM (they checkpoint), then it is cancelled. The
        engine says so in its status once it has stopped (`sync` records it; `wait` waits)."""
        rec = self.refresh()
        if rec.state.finished or self.backend is None:
            return
        self.backend.cancel(rec.job_id or rec.id)
        self.sync()

    # -- what the run left ---------------------------------------------------------------------

    def _file(self, name: str) -> Path | None:
        d = self.run_dir
        return None if d is None else d / name

    def records(self, kind: str) -> list[dict[str, Any]]:
        """The run's ``metrics`` or ``events`` records from the protocol channel: its run
        directory's ``{kind}.jsonl`` when the run directory is on this machine (none yet: [];
        what the program prints is never read as a record then), else the ``@tgnb`` lines of its
        logs (a Kubernetes pod's, a remote Slurm job's). A record that is not one of `kind`'s
        (`tgnb.events.metrics_row`: a step that is not a whole number...) is passed over: one bad
        record never breaks a reader."""
        path = self._file(f"{kind}.jsonl")
        if path is not None and path.parent.is_dir():  # read only what was appended since
            if kind == "metrics":
                return cursor.rows(path)
            return [dict(r) for r in cursor.records(path) if isinstance(r, dict)]
        job = self._record.job_id
        if self.backend is not None and job and hasattr(self.backend, "logs_after"):
            return cursor.engine_records(self.backend, job, kind)  # only what was written since
        found: list[dict[str, Any]] = []
        for line in self.logs(raw=True):
            rec = parse_record(line)
            if rec is not None and rec.pop("kind", None) == kind:
                found.append(rec)
        if kind == "metrics":
            return [row for r in found if (row := metrics_row(r)) is not None]
        return [r for r in found if isinstance(r, dict)]

    def metrics(self) -> pd.DataFrame:
        """The run's metrics (one row per logged optimizer step) as a pandas DataFrame."""
        import pandas as pd

        rows = self.records("metrics")
        df = pd.DataFrame(rows)
        if "step" in df.columns:
            df = df.sort_values("step", kind="stable").reset_index(drop=True)
        return df

    def prices(self) -> Prices | None:
        """Dollars per GPU-hour of the run's node classes: as its launch resolved them (a run
        with a budget), else its cluster's as last read (`tgnb.prices`; no request is sent);
        None when neither is known."""
        if self._record.spec.prices is not None:
            return self._record.spec.prices
        last = getattr(self.cluster, "last", None)
        return None if last is None else last.prices()

    def cost(self) -> RunCost:
        """The run's GPU-hours by node class and the work preemptions cost it, so far
        (`tgnb.runs.cost.run_cost`); ``.dollars(run.prices())`` prices them."""
        res = self._record.spec.resources
        until = None  # a node whose release was never recorded is held until now...
        if self._record.state.finished and (changes := self.history()):
            until = datetime.fromtimestamp(changes[-1].time, timezone.utc)  # ...or the run's end
        gpus = int(res.gpus_per_node) * int(res.nodes)
        return run_cost(self.name, self.run_events(), gpus, until)

    def summary(self, prices: Prices | None = None) -> dict[str, Any]:
        """What the run achieved and what it cost (`tgnb.runs.summary.summarize`, whose docstring
        lists the keys), its dollars at `prices` (default `Run.prices`)."""
        cost = self.cost()
        return summarize(
            self.name,
            self.report().state.value,
            self.records("metrics"),
            self.run_events(),
            cost,
            max_steps=self.max_steps(),
            restarts=self._record.restart_count,
            kind=self._record.spec.train.algorithm,
            spending=self.spending(prices, cost),
        )

    def spending(self, prices: Prices | None = None, cost: RunCost | None = None) -> dict[str, Any]:
        """``gpu_hours`` so far, their ``cost_usd`` at `prices` (default `prices`; None when
        no price is known) and the run's ``budget_usd`` (None: no budget)."""
        return spending(cost or self.cost(), prices or self.prices(), self._record.spec.budget_usd)

    def run_events(self) -> list[Event]:
        """The run's own events (runtime and supervisor), oldest first."""
        path = self._file("events.jsonl")
        if path is not None and path.exists():
            return cursor.events(path, run=self.name)
        job = self._record.job_id
        if self.backend is not None and job and hasattr(self.backend, "logs_after"):
            return cursor.engine_events(self.backend, job)  # parsed once, fetched after a cursor
        evs = (from_record(r) for r in self.records("events"))
        return dedupe(e for e in evs if e is not None)

    def nodes_used(self) -> list[str]:
        """Every node the run was placed on, in order."""
        seen: list[str] = []
        for change in self.history():
            if change.node and change.node not in seen:
                seen.append(change.node)
        for node in self.refresh().nodes:
            if node not in seen:
                seen.append(node)
        return seen

    def events(self, cluster: bool = True) -> list[Event]:
        """Run events merged with the cluster's node events for the nodes it ran on (and the
        replacement nodes added after one of them was preempted), de-duplicated, by time.
        The cluster's `ApiError` (after its client's retries) is raised, as `Session.events`
        raises it: ``cluster=False`` reads the run's own events only."""
        evs = self.run_events()
        if cluster and self.cluster is not None:
            nodes = set(self.nodes_used()) | {e.node for e in evs if e.node}
            node_events = list(self.cluster.events())
            first_loss = min(
                (e.time for e in node_events if e.node in nodes and e.reason == PREEMPTED),
                default=None,
            )
            for ev in node_events:
                if ev.node in nodes or (
                    first_loss is not None and ev.reason == NODE_ADDED and ev.time >= first_loss
                ):
                    evs.append(ev)
        return dedupe(evs)

    @overload
    def logs(self, raw: bool = False, follow: Literal[False] = False) -> list[str]: ...
    @overload
    def logs(self, raw: bool = False, *, follow: Literal[True]) -> None: ...
    def logs(self, raw: bool = False, follow: bool = False) -> list[str] | None:
        """The program's output so far; tgnb's ``@tgnb`` protocol lines (metrics and events,
        read by `records`) are left out unless `raw`. With `follow`, print it as it is written
        across the run's attempts, each after a header line (node, start, how the one before
        ended), until the run has ended (`tgnb.runs.livelog`); Ctrl-C stops following only."""
        if follow:
            from tgnb.runs import livelog

            livelog.show(self, raw=raw)
            return None
        path = self._file(TRAIN_LOG)
        lines: list[str] = []
        if path is not None and path.exists():
            lines = logtail.read_lines(path)
        elif self.backend is not None and self._record.job_id:
            lines = list(self.backend.logs(self._record.job_id, follow=False))
        return lines if raw else [out for ln in lines if (out := program_text(ln)) is not None]

    def follow(self, records: bool = False, poll: float = 0.2, raw: bool = False) -> Iterator[Any]:
        """Yield log lines as they are written, until the run has finished.

        With ``records=True`` yield only the ``@tgnb`` records (dicts with a ``kind`` of
        ``metrics`` or ``events``); with ``raw=True`` every line as written. The backend (or,
        without one, `tgnb.runs.logtail`) yields the raw lines; they are told apart here.
        """
        for line in self._follow_lines(poll):
            if raw:
                yield line
            elif not records:
                text = program_text(line)
                if text is not None:
                    yield text
            else:
                rec = parse_record(line)
                if rec is not None:
                    yield rec

    def _follow_lines(self, poll: float) -> Iterator[str]:
        rec = self.refresh()
        if self.backend is not None and rec.job_id:
            yield from self.backend.logs(rec.job_id, follow=True)
            return
        path = self._file(TRAIN_LOG)
        if path is not None:
            yield from logtail.tail(path, lambda: self.refresh().state.finished, poll)


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)(: .*)?$")


def last_error(lines: list[str]) -> str | None:
    """The failure a log ends with: the last ``tgnb...:`` refusal line, or the exception line of
    its last traceback (``ValueError: ...``); None when the log holds neither."""
    for line in reversed(lines[-400:]):
        text = line.strip()
        if (
            text.startswith(("tgnb train: ", "tgnb.train.launch: "))
            and "workers exited" not in text
        ):
            return text.partition(": ")[2][:500]
        if _EXCEPTION_LINE.match(text) and not text.startswith(("SystemExit", "KeyboardInterrupt")):
            return text[:500]
    return None
