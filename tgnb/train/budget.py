"""A run's ``budget_usd`` held on its node, by the node's own process: the launcher (``python -m
tgnb.train.launch``, torchrun) or the runtime alone (``python -m tgnb.train``: a ``command``, a
one-process built-in task).

On Slurm and Kubernetes nothing of tgnb's runs beside a job, so the node holds the run's budget
itself, with the notebook closed as well as open (`held`). The engine gives the node the run's
`tgnb.runs.budget.Budget` (the dollars, the prices of its launch, its GPUs) in
`tgnb.runs.node.BUDGET_ENV`; the node's process takes it out of its environment, so its children
(torchrun's workers, a command) do not hold it again. Every `POLL_SECONDS` a thread prices the run
from its ``events.jsonl`` in the run directory on shared storage, which survives requeues and
holds every earlier attempt's starts and exits: the one rule of `tgnb.runs.budget`, measured as the
local supervisor and the cockpit measure it. Node 0 records the events now due (a
``BudgetNotice`` at 80 %, a ``BudgetReached`` at the budget). At the budget the launcher sends
itself SIGTERM, as a preemption does: torchrun's agent (or the runtime's command) passes it on to
the program, which seals a checkpoint and exits; the node then exits
`tgnb.runs.node.Exit.STOPPED`, which no engine restarts (`tgnb.runs.recovery.FINAL_CODES`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tgnb.events import RUN_RESUMED, RUN_STARTED, read_jsonl, utcnow
from tgnb.runs import node
from tgnb.runs.budget import Budget, check_events
from tgnb.runs.outcome import events_size, node_exit

#: How often the node prices its run (real seconds).
POLL_SECONDS = 1.0


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
    ) -> None:
        self.run_dir, self.name, self.budget = Path(run_dir), name, budget
        self.record, self.poll = record, poll
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
                return


def watch(run_dir: str | None) -> BudgetWatch | None:
    """The run's `BudgetWatch`, started, when the engine gave a budget (`node.BUDGET_ENV`, taken
    out of the environment: this process holds it, not its children)."""
    text = os.environ.pop(node.BUDGET_ENV, "").strip()
    if not text or run_dir is None:
        return None
    name = os.environ.get(node.RUN_ENV) or Path(run_dir).name
    budget = Budget.from_json(text)
    return BudgetWatch(run_dir, name, budget, record=node.node_rank() == 0).start()


def held(run_dir: str | None, program: Callable[[], int]) -> int:
    """Run the node's `program` (its exit code) with the run's budget held (`watch`): the
    program's code, or `Exit.STOPPED` once the budget stopped it -- at once, starting nothing,
    when earlier attempts spent it."""
    since = events_size(run_dir) if run_dir else 0
    budget = watch(run_dir)
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


__all__ = ["POLL_SECONDS", "BudgetWatch", "held", "watch"]
