"""The placement loop every engine runs: observe, `decide`, act, record once per decision.

`tgnb.runs.recovery` holds the rule (`decide`: where a run starts next, that it waits, or that a
run on standard nodes goes back to preemptible ones). `PlacementLoop` is the loop around it, the
same on every engine (the local supervisor, the Slurm placer job, the Kubernetes placer pod);
only its ends are the engine's own (an `Engine`):

- ``observe()``: the `Facts` of the run (the cluster's free nodes of each class, how long it has
  been short, its progress; `Facts.current`, the class it runs on, while it runs), or None when
  there is nothing to decide (the run's job runs on the class it asked for, no pod is gated, the
  emulator is unreachable); an engine that could not look this time and wants the placement kept
  as it was raises `NoAnswer` (nothing is recorded, the last decision stands);
- ``act(decision)``: carry the decision out (claim the nodes, lift a pod's gate, change a pending
  job's constraint, stop an attempt on standard nodes so that it restarts on preemptible ones)
  and return it as carried out: a start the engine could not carry out (the nodes were taken
  meanwhile) comes back as the wait it became, with its reason;
- ``record(decision)``: put it on the run's timeline (a ``RecoveryDecided`` event);
- ``done()``: whether the loop has ended (the run's job has finished, its nodes were claimed).

`PlacementLoop.step` runs the first three in that order with the one dedupe rule: a decision is
recorded when its `key` (action, nodes, node class, rule) differs from the last one recorded, so a
run that waits says why once, not at every poll, and again when the decision changes (not when
only the figures in its reason do); a ``keep`` (the run stays where it runs) is never recorded. A
``None`` from ``observe`` ends the placement: the next decision is a new one, recorded.
`PlacementLoop.run` steps until ``done()``, a poll apart. An engine that places each start afresh
(the local supervisor) takes a new loop per placement.

The failure backoff (`RecoveryPolicy.backoff`) is computed here for the engines whose waits run
where no Python object lives (an sbatch script, a pod's init container): `backoff_table` is the
policy's delay for each failure count, rendered into the script or the pod, and
``python -m tgnb.runs.placing backoff FAILURES TABLE [DONE_FILE]`` sleeps the delay of one count
(`wait_backoff`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from tgnb.runs.recovery import DECISION_DATA, Decision, Facts, RecoveryPolicy, decide

#: What makes two decisions the same one, for the timeline (`PlacementLoop.step`).
Key = tuple[object, ...]


def key(d: Decision) -> Key:
    """The fields that make a decision new: those a ``RecoveryDecided`` event carries."""
    return tuple(getattr(d, k) for k in DECISION_DATA)


class NoAnswer(Exception):
    """Raised by an engine that could not look or act this time (its controller did not answer):
    the placement goes on at the next poll, as it was."""


class Engine(Protocol):
    """What an engine provides to the placement loop (see the module's docstring)."""

    def observe(self) -> Facts | None: ...

    def act(self, decision: Decision) -> Decision: ...

    def record(self, decision: Decision) -> None: ...

    def done(self) -> bool: ...


class PlacementLoop:
    """One run's placement loop over `engine`, by `policy`."""

    def __init__(self, policy: RecoveryPolicy, engine: Engine) -> None:
        self.policy = policy
        self.engine = engine
        self.last: Key | None = None  # the key of the last decision recorded

    def step(self) -> Decision | None:
        """Observe, decide, act, and record the decision if it is new; the decision as carried
        out, or None when there was nothing to decide."""
        facts = self.engine.observe()
        if facts is None:
            self.last = None
            return None
        d = self.engine.act(decide(self.policy, facts))
        if d.action != "keep" and key(d) != self.last:
            self.engine.record(d)
            self.last = key(d)
        return d

    def run(self, poll_s: float, sleep: Callable[[float], object] = time.sleep) -> None:
        """Step every `poll_s` until the engine is done; a step that got `NoAnswer` is tried
        again at the next poll."""
        while not self.engine.done():
            with contextlib.suppress(NoAnswer):
                self.step()
            if self.engine.done():
                return
            sleep(poll_s)


# -- the failure backoff --------------------------------------------------------------------------


def backoff_table(policy: RecoveryPolicy) -> tuple[float, ...]:
    """The policy's delay before the restart after each failure (the `n`-th entry for the
    `n`-th failure), up to the last that differs (later failures wait as long) or the last
    restarted (`max_restarts`); empty when no failure is restarted."""
    out: list[float] = []
    for failures in range(1, policy.max_restarts + 1):
        delay = policy.backoff(failures)
        if out and delay == out[-1]:
            break
        out.append(delay)
    return tuple(out)


def seconds(value: float) -> str:
    """`value` as a shell's ``sleep`` and a JSON reader both take it (``5``, ``2.5``)."""
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def delay(table: Sequence[float], failures: int) -> float:
    """The delay of `backoff_table` for `failures` counted so far (0: none)."""
    if failures <= 0 or not table:
        return 0.0
    return float(table[min(failures, len(table)) - 1])


def wait_backoff(table: Sequence[float], failures: int, done: Path | None = None) -> float:
    """Sleep the delay of `failures`; with `done`, a file keeping the count already waited for,
    only once per count (a pod started again after a preemption keeps the count of its last
    failure: it waits nothing). Returns the seconds slept."""
    if done is not None:
        try:
            if failures <= int(done.read_text().strip() or 0):
                return 0.0
        except (OSError, ValueError):  # none yet (or half-written): not waited for
            pass
    wait = delay(table, failures)
    if wait > 0:
        print(f"tgnb: failure {failures} counted: restarting in {seconds(wait)} s", flush=True)
        time.sleep(wait)
    if done is not None and failures > 0:
        done.write_text(f"{failures}\n")
    return wait


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tgnb.runs.placing backoff FAILURES TABLE [DONE_FILE]``: sleep the delay of
    `FAILURES` (empty: none yet) in `TABLE` (`backoff_table`, comma-separated), once per count
    with `DONE_FILE` (`wait_backoff`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m tgnb.runs.placing backoff FAILURES DELAY[,DELAY...] [DONE_FILE]"
    if len(args) not in (3, 4) or args[0] != "backoff" or not (args[1] == "" or args[1].isdigit()):
        print(usage, file=sys.stderr)
        return 2
    try:
        table = [float(x) for x in args[2].split(",") if x]
    except ValueError:
        print(usage, file=sys.stderr)
        return 2
    wait_backoff(table, int(args[1] or 0), Path(args[3]) if len(args) == 4 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
