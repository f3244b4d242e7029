"""A run's ``budget_usd`` held on its node, by the node's own process: the launcher (``python -m
tgnb.train.launch``, torchrun) or the runtime alone (``python -m tgnb.train``: a ``command``, a
one-process built-in task).

On Slurm and Kubernetes nothing of tgnb's runs beside a job, so the node holds the run's budget
itself, with the notebook closed as well as open (`held`). The node reads the run's
`tgnb.runs.budget.Budget` (the dollars, the prices of its launch, its GPUs) from its run file
(`tgnb.runs.runfile`); the node's top tgnb process holds it, its children (torchrun's workers, a
command: `tgnb.runs.node.METERED_ENV` is set for them) do not hold it again, nor does a node whose
engine meters from outside (the local supervisor holds the budget there). A job rendered before the
run file gives it in `tgnb.runs.node.BUDGET_ENV` instead, taken out of the environment. Every
`POLL_SECONDS` a thread prices the run from its ``events.jsonl`` in the run directory on shared
storage, which survives requeues and holds every earlier attempt's placements and releases
(`NodeMeter`, `tgnb.runs.meter`): the one rule of `tgnb.runs.budget`, measured as the local
supervisor and the cockpit measure it, for every program. Node 0 records the events now due (a
``BudgetNotice`` at 80 %, a ``BudgetReached`` at the budget). At the budget the launcher sends
itself SIGTERM, as a preemption does: torchrun's agent (or the runtime's command) passes it on to
the program, which seals a checkpoint (if it uses protect or the Checkpointer) and exits; what is
still running `GRACE_SECONDS` later is killed. The node then exits `tgnb.runs.node.Exit.STOPPED`,
which no engine restarts (`tgnb.runs.recovery.FINAL_CODES`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tgnb.errors import ValidationError
from tgnb.events import JOB_PLACED, JOB_RELEASED, RUN_RESUMED, RUN_STARTED, read_jsonl, utcnow
from tgnb.runs import ft, meter, node
from tgnb.runs.budget import Budget, check_events
from tgnb.runs.outcome import events_size, node_exit

#: How often the node prices its run (real seconds).
POLL_SECONDS = 1.0
#: After the budget's SIGTERM, the program's grace (seconds) before what it started is killed,
#: as the local supervisor kills a run that outlives its stop.
GRACE_SECONDS = 30.0
#: Another grace for this node's budget stop (seconds; a test's knob, tgnb never sets it).
GRACE_ENV = "TGNB_BUDGET_GRACE_S"
#: At the budget, the stop waits this long for the program to start (its ``RunStarted``: torchrun
#: passes a SIGTERM on to its workers once they run); a program that records no start is
#: stopped once this has passed.
STARTUP_GRACE_SECONDS = 10.0


def kill_descendants(root: int) -> int:
    """SIGKILL every live descendant of process `root` (by parent pid, from ``/proc``; Linux);
    how many were signalled."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [root]
    while todo:
        parent = todo.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        found += kids
        todo += kids
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(found)


class BudgetWatch:
    """Prices run `name` (run directory `run_dir`) against `budget` every `poll` seconds on a
    daemon thread; at the budget, `reached` is set and `stop` is called once (by default SIGTERM
    to this process). Events are recorded only when `record` (node 0)."""

    def __init__(
        self,
        run_dir: str,
        name: str,
        budget: Budget,
        *,
        record: bool = True,
        poll: float = POLL_SECONDS,
        grace: float = GRACE_SECONDS,
    ) -> None:
        self.run_dir, self.name, self.budget = Path(run_dir), name, budget
        self.record, self.poll, self.grace = record, poll, grace
        self.reached = threading.Event()
        self.since = utcnow()  # this attempt's records are the later ones
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tgnb-budget", daemon=True)

    def start(self) -> BudgetWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()

    def check(self) -> tuple[bool, bool]:
        """Price the run once and record what is due: (at the budget, the program started in
        this attempt: torchrun passes a SIGTERM on to its workers once they run)."""
        from tgnb.train.record import Recorder

        evs = read_jsonl(self.run_dir / node.EVENTS, run=self.name)
        started = any(e.reason in (RUN_STARTED, RUN_RESUMED) and e.time >= self.since for e in evs)
        # a program with no hook of tgnb's records no start: it runs once given its grace
        started = started or (utcnow() - self.since).total_seconds() >= STARTUP_GRACE_SECONDS
        found = check_events(self.name, self.budget, evs)
        if found.due and self.record:
            recorder = Recorder(self.run_dir, self.name)
            for reason, line in found.due:
                recorder.event(reason, line, **found.data)
                print(f"tgnb: {line}", file=sys.stderr, flush=True)
            recorder.close()
        return found.reached, started

    def stop(self) -> None:
        """The stop a preemption makes: SIGTERM to this launcher (torchrun's agent passes it on)."""
        os.kill(os.getpid(), signal.SIGTERM)

    def _loop(self) -> None:
        while not self._done.wait(self.poll):
            reached, started = self.check()
            if reached and started:
                self.reached.set()
                self.stop()
                if not self._done.wait(self.grace):  # the program outlived its grace: killed
                    killed = kill_descendants(os.getpid())
                    print(f"tgnb: the program did not stop within {self.grace:g} s of the "
                          f"budget's SIGTERM: killed {killed} process(es)",
                          file=sys.stderr, flush=True)  # fmt: skip
                return


def watch(run_dir: str | None, budget: Budget | None = None) -> BudgetWatch | None:
    """The run's `BudgetWatch`, started, for `budget` (the run file's), else for a job rendered
    before the run file, the engine's `node.BUDGET_ENV` (taken out of the environment: this
    process holds it, not its children); None without either."""
    text = os.environ.pop(node.BUDGET_ENV, "").strip()
    if budget is None and text:
        budget = Budget.from_json(text)
    if budget is None or run_dir is None:
        return None
    name = os.environ.get(node.RUN_ENV) or Path(run_dir).name
    grace = float(os.environ.get(GRACE_ENV) or GRACE_SECONDS)
    return BudgetWatch(run_dir, name, budget, record=node.node_rank() == 0, grace=grace).start()


class NodeMeter:
    """The node's own meter on Slurm and Kubernetes (`tgnb.runs.meter`): ``JobPlaced`` when the
    node's top tgnb process starts, ``JobReleased`` with the exit code and its cause when it ends,
    whatever program it runs. Not where the engine meters from outside (the local supervisor) or an
    outer tgnb process of the node already does (`node.METERED_ENV`)."""

    def __init__(self, run_dir: str) -> None:
        from tgnb.train.record import Recorder

        name = os.environ.get(node.RUN_ENV) or Path(run_dir).name
        self.recorder = Recorder(run_dir, name)
        self.recorder.node = self.recorder.node or socket.gethostname()
        self.gpus = _int_env(node.GPUS_ENV) or _budget_gpus()
        restart = next((_int_env(v) for v in node.RESTART_VARS if os.environ.get(v)), None)
        self.data: dict[str, object] = {"gpus": self.gpus}
        if restart is not None:
            self.data["restart_count"] = restart
        group = _group()
        if group is not None:  # a replica group's node (issue 50): metered as that group
            self.data["group"] = group
        self.recorder.engine_event(
            JOB_PLACED, f"placed on {self.recorder.node} ({self.gpus} GPU(s))", **self.data
        )

    @classmethod
    def start(cls, run_dir: str | None) -> NodeMeter | None:
        if run_dir is None or os.environ.get(node.METERED_ENV) or not Path(run_dir).is_dir():
            return None  # metered already, or no run directory an engine made
        meter = cls(run_dir)
        os.environ[node.METERED_ENV] = "node"  # the processes it starts do not meter again
        return meter

    def release(self, code: int, cause: str) -> None:
        self.recorder.engine_event(
            JOB_RELEASED,
            f"released {self.recorder.node}: {cause} (exit {code})",
            exit_code=code,
            cause=cause,
            **self.data,
        )
        self.recorder.close()


def _budget_gpus() -> int:
    """Without `node.GPUS_ENV` (a node rendered before it), the GPUs its budget prices."""
    text = os.environ.get(node.BUDGET_ENV, "").strip()
    try:
        return Budget.from_json(text).gpus if text else 0
    except ValidationError:  # said once the budget is read (`_held`)
        return 0


def _int_env(name: str) -> int:
    try:
        return max(int(os.environ.get(name, "") or 0), 0)
    except ValueError:
        return 0


def cause_of(code: int) -> str:
    """Why a node's program ended, by its exit code (`tgnb.runs.meter.CAUSES`)."""
    if code == 0:
        return meter.DONE
    if code == int(node.Exit.PREEMPTED):
        return meter.PREEMPTED
    if code in (-signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGINT):
        return meter.SIGNALLED
    return meter.FAILED


def _group() -> int | None:
    """This node's replica group (`tgnb.runs.ft.group_env`, which the engine sets with the
    lighthouse's URL), None outside a fault-tolerant run."""
    text = os.environ.get(ft.REPLICA_GROUP_ENV, "").strip()
    return int(text) if os.environ.get(ft.LIGHTHOUSE_ENV) and text.isdigit() else None


def held(run_dir: str | None, program: Callable[[], int], budget: Budget | None = None) -> int:
    """Run the node's `program` (its exit code) metered (`NodeMeter`) and with the run's budget
    (the run file's `budget`) held (`watch`) where this is the node's top tgnb process and its
    engine does not meter from outside: the program's code, or `Exit.STOPPED` once the budget
    stopped it -- at once, starting nothing, when earlier attempts spent it."""
    if os.environ.get(node.METERED_ENV):  # a child of the process holding it, or the local engine
        budget = None
    metered = NodeMeter.start(run_dir)
    code, cause = int(node.Exit.FAILED), meter.FAILED
    try:
        code = _held(run_dir, program, budget)
        cause = meter.BUDGET if code == int(node.Exit.STOPPED) else cause_of(code)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(node.Exit.FAILED)
        cause = cause_of(code)
        raise
    except KeyboardInterrupt:
        code, cause = 128 + signal.SIGINT, meter.SIGNALLED
        raise
    finally:
        if metered is not None:
            metered.release(code, cause)
    return code


def _held(run_dir: str | None, program: Callable[[], int], given: Budget | None) -> int:
    since = events_size(run_dir) if run_dir else 0
    try:
        budget = watch(run_dir, given)
    except ValidationError as exc:  # refused before anything runs: the engine's variable is bad
        print(f"tgnb: {exc}", file=sys.stderr, flush=True)
        return int(node.Exit.BAD_CONFIG)
    if budget is not None and budget.check()[0]:
        budget.close()
        print(f"tgnb: the run's budget is spent; exit {int(node.Exit.STOPPED)}", file=sys.stderr)
        return int(node.Exit.STOPPED)
    try:
        code = program()
    except SystemExit as exc:  # a built-in run leaves through it (`tgnb.train.protect`)
        if budget is None or not budget.reached.is_set():
            raise
        code = exc.code if isinstance(exc.code, int) else int(node.Exit.FAILED)
    finally:
        if budget is not None:
            budget.close()
    if budget is None or not budget.reached.is_set():
        return code
    sealed = node_exit(run_dir, int(node.Exit.FAILED), since) == node.Exit.PREEMPTED
    what = "a sealed checkpoint" if sealed else "no checkpoint sealed"
    print(f"tgnb: stopped at the run's budget, {what}; exit {int(node.Exit.STOPPED)}",
          file=sys.stderr, flush=True)  # fmt: skip
    return int(node.Exit.STOPPED)


__all__ = [
    "GRACE_SECONDS",
    "POLL_SECONDS",
    "BudgetWatch",
    "NodeMeter",
    "cause_of",
    "held",
    "kill_descendants",
    "watch",
]
