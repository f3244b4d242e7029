"""The local backend's supervisor: one detached process per run, acting as the node's kubelet or
slurmd for that run.

It is started in a new session (``start_new_session=True``), so it outlives the notebook kernel
that launched the run. It places the run on emulated nodes of the right kind, launches
``python -m tgnb.train`` as a process group per node (a single-node run is forked from this
process once it has imported the training stack: see `tgnb.backends.local.warm`), watches those nodes and behaves as the
platform does when one is preempted:

- KUBERNETES-type cluster: SIGTERM to the process group at T+0 (when the preemption notice
  appears), SIGKILL at the end of the drain window (the node is removed), and the pod is recreated
  on another node as soon as one is schedulable, with ``TGNB_RESTART_COUNT`` incremented.
- SLURM-type cluster: a drain and no signal at T+0 (the runtime's drain watcher reads the notice
  file named by ``TGNB_NOTICE_FILE``), a kill at T+window, and a requeue with
  ``SLURM_RESTART_COUNT`` incremented.

Each start is placed by the run's recovery policy (`tgnb.runs.recovery.decide`, from the
emulator's node list): on the preemptible nodes it asks for, or, when they are short, wait, shrink
to fewer nodes, or move to standard nodes (and back to preemptible ones as soon as the policy would
start there: the run is stopped with SIGTERM, checkpoints and restarts). Each decision is a
``RecoveryDecided`` event with its reason. Before a restart on preemptible nodes, ``checkpoint.auto``'s
preemption rate is estimated again from the cluster read then (`tgnb.cloud.rates.apply`), in the
config file the relaunch reads. How an attempt ended is `tgnb.runs.outcome.classify`'s verdict, by
what the runtime recorded first, then by the exit code: a sealed preemption checkpoint, a "resume
me" code (75), or any end of a process whose node was preempted, means start again (uncounted);
exit 0 after the SIGTERM with no checkpoint is no success (restarted, uncounted: "stopped without
a checkpoint at step N"); exit 0 otherwise means succeeded; anything else is a
failure, restarted after the policy's backoff while at most ``max_restarts`` are counted
(``RunFailedRestarting``). Every state change goes to the run store and
the supervisor's own events (JobPlaced, SignalSent, JobKilled, RunRequeued, RecoveryDecided) go to the run's
``events.jsonl`` with source ``"tgnb"``, timed by the same clock as the emulator's node events.
When the emulator cannot be reached it keeps going: the notice and removal files are on disk, and
the node list is fetched again at the next poll. When the emulator of its tgnb home was *stopped*
(``tgnb emulator stop`` removed its ``server.json``) and has not come back within
`EMULATOR_GONE_S`, it stops the run as a cancel does (SIGTERM: the run checkpoints) and exits, so
no supervisor outlives the emulator it plays the platform for. A run launched with a
``budget_usd`` is priced as it goes (`check_budget`): a ``BudgetNotice`` at 80 % of it, and at the
budget a ``BudgetReached`` and the same stop (SIGTERM: the run checkpoints, then is cancelled).

Run it as ``python -m tgnb.backends.local.supervisor --home HOME --run RUN_ID --cluster ID --type T``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tgnb.atomic import atomic_write
from tgnb.backends.base import JobState
from tgnb.backends.local import groups, proctree
from tgnb.backends.local.command import (
    TRAIN_MODULE,
    TRAIN_MODULE_ENV,
    free_port,
    node_env,
    node_gpus,
    train_command,
)
from tgnb.backends.local.home import EMULATOR_GONE_S, EMULATOR_STOPPED, HomeEmulator, endpoint_for
from tgnb.backends.local.nodes import NodeInfo, NodeSource, cluster_reader
from tgnb.backends.local.placement import Placement, Running, placement_facts
from tgnb.backends.local.warm import ForkedProcess, fork_module, preload
from tgnb.cloud import ClusterState, rates
from tgnb.events import (
    BUDGET_NOTICE,
    JOB_KILLED,
    JOB_PLACED,
    JOB_RELEASED,
    RECOVERY_DECIDED,
    RUN_FAILED_RESTARTING,
    RUN_REQUEUED,
    SIGNAL_SENT,
    Event,
    utcnow,
)
from tgnb.runs import budget, cursor, meter, node, placing
from tgnb.runs.budget import BUDGET_STOP
from tgnb.runs.node import Exit
from tgnb.runs.outcome import Attempt, Verdict, classify, events_size, failed_detail, requeued
from tgnb.runs.recovery import Decision, Facts
from tgnb.runs.runfile import RunFile
from tgnb.runs.store import RunStore

TRAIN_LOG = node.LOG
STOP_GRACE_SECONDS = 30.0
Proc = subprocess.Popen[bytes] | ForkedProcess


class _Stopped(BaseException):
    """Raised from the SIGTERM handler to cut the training stack's import short."""


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended: `kind`, the exit code that decided it, and for a requeue the node
    whose preemption caused it."""

    kind: Literal["succeeded", "failed", "cancelled", "requeue"]
    exit_code: int = 0
    node: str | None = None
    #: the attempt's verdict (`tgnb.runs.outcome.classify`); None for a cancel
    verdict: Verdict | None = None


class Supervisor:
    """Runs one run to its end on the nodes of one emulated cluster."""

    def __init__(
        self,
        store: RunStore,
        run: str,
        source: NodeSource,
        *,
        cluster_type: str,
        poll: float = 0.2,
        emulator_stopped: Any = None,
        cluster_state: Callable[[], ClusterState] | None = None,
    ) -> None:
        self.store = store
        self.record = store.get(run)
        self.source = source
        self.slurm = cluster_type.upper() == "SLURM"
        self.poll = poll
        self.run_dir = Path(self.record.run_dir or ".")
        self.stop_requested = False
        self.warm = False  # fork each start from this process once the training stack is imported
        self._cache: dict[str, NodeInfo] = {}
        self._api_ok = True
        self._preloading = False  # a SIGTERM then cuts the import short (`_on_stop`)
        #: () -> bool: the home's emulator was stopped on purpose, long enough ago
        self.emulator_stopped = emulator_stopped or (lambda: False)
        self.stop_reason = ""
        self.policy = self.record.spec.policy  # the recovery policy (`tgnb.runs.recovery`)
        self.node_class = "preemptible"  # of the current attempt
        self.started = self.record.created_at
        self.moving = False  # leaving standard nodes for preemptible ones (`Running`)
        self.cluster_state = cluster_state  # () -> ClusterState: the cluster read now
        self.train = self.record.spec.train  # the node's config (`reestimate` replaces it)

    # -- events and nodes ----------------------------------------------------------------------

    def _gone(self, name: str) -> NodeInfo:
        """A node the emulator no longer lists: removed."""
        return NodeInfo(name, self.source.cluster_id, "unknown", "removed", gpus=0)

    def event(self, reason: str, message: str, node: str | None = None, **data: Any) -> None:
        ev = Event(utcnow(), "tgnb", reason, message, node=node, run=self.record.name, data=data)
        with open(self.run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
            fh.write(ev.to_json() + "\n")

    def refresh(self) -> list[NodeInfo] | None:
        """The cluster's nodes, or None when the emulator cannot be reached (cache kept)."""
        try:
            nodes = self.source.nodes()
        except Exception as exc:  # the daemon may be restarting: retry at the next poll
            if self._api_ok:
                self._api_ok = False
                print(f"emulator unreachable ({type(exc).__name__}); retrying", flush=True)
            if not self.stop_requested and self.emulator_stopped():
                print("the emulator was stopped: stopping the run", flush=True)
                self.stop_requested, self.stop_reason = True, EMULATOR_STOPPED
            return None
        if not self._api_ok:
            print("emulator reachable again", flush=True)
        self._api_ok = True
        self._cache = {n.name: n for n in nodes}
        return nodes

    def facts(self, nodes: Sequence[NodeInfo], short_for: float) -> Facts:
        return placement_facts(self.record.spec, nodes, short_for, self.run_dir, self.started)

    def place(self, restart: int) -> list[NodeInfo] | None:
        """Decide where the run starts (`tgnb.runs.recovery.decide`: wait, shrink to fewer nodes,
        or move to standard nodes) in the one placement loop (`tgnb.runs.placing`, over this
        start's `Placement`), claim those nodes in the run store (the run is then running there)
        and put each decision on the run's timeline once; None if stopped meanwhile."""
        placement = Placement(self, restart)
        placing.PlacementLoop(self.policy, placement).run(self.poll * 2)
        return placement.chosen

    def decision(self, d: Decision) -> None:
        self.event(RECOVERY_DECIDED, d.reason, **d.data())

    # -- one attempt ---------------------------------------------------------------------------

    def _env(self, where: NodeInfo, restart: int) -> dict[str, str]:
        notice = where.notice_file if self.slurm else None
        return node_env(self.record, where.name, restart, self.slurm, notice)

    def _write_config(self) -> Path:
        """This start's run file (`tgnb.runs.runfile`: the run's spec with its `train` as this
        start runs it), and its ``config.yaml`` view beside it; the run file's path."""
        run = RunFile(self.record.spec, self.record.created_at).with_train(self.train)
        atomic_write(self.run_dir / node.CONFIG, run.config_yaml())  # one whole version each
        path = self.run_dir / node.RUN_FILE
        atomic_write(path, run.to_json())
        return path

    def reestimate(self, nodes: Sequence[NodeInfo], restart: int) -> None:
        """Before restart `restart` on preemptible `nodes`: ``checkpoint.auto``'s rate from the
        cluster read now, whose events hold the preemption just seen (`rates.apply`); the
        last estimate stays when the cluster cannot be read."""
        if restart == 0 or self.node_class != "preemptible" or self.cluster_state is None:
            return
        try:
            state = self.cluster_state()
        except Exception as exc:  # the emulator may be restarting: the last estimate stands
            print(f"preemption rate not re-read ({type(exc).__name__}); kept", flush=True)
            return
        self.train = rates.apply(self.train, state, len(nodes), restart=restart)[0]

    def attempt(self, nodes: Sequence[NodeInfo], restart: int) -> Outcome:
        """Launch on `nodes` and watch until the processes end."""
        self.moving = False
        config = self._write_config()
        rdzv = f"127.0.0.1:{free_port()}"
        names = [n.name for n in nodes]
        gpus = node_gpus(self.record.spec.resources.gpus_per_node, [n.gpus for n in nodes])
        model = node.processes(self.train, len(nodes), gpus)  # the one process model
        procs: list[Proc] = []
        since = events_size(self.run_dir)  # this attempt's records begin here
        with open(self.run_dir / TRAIN_LOG, "ab") as log:
            # warm: forked from this process; a run whose env only a fresh interpreter applies
            # (PYTHONPATH, OMP_NUM_THREADS, ...) starts cold, so that env applies on every start
            cold = node.needs_cold_start(self.record.spec.env)
            if self.warm and len(nodes) == 1 and not model.torchrun and not cold:
                argv = [str(config), "--run-dir", str(self.run_dir)]
                env = self._env(nodes[0], restart)
                procs.append(fork_module(TRAIN_MODULE, argv, env, str(self.run_dir), log.fileno()))
            for rank, where in enumerate(nodes if not procs else ()):
                cmd = train_command(config, self.run_dir, model, len(nodes), rank, rdzv)
                procs.append(
                    subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=self.run_dir,
                        env=self._env(where, restart),
                        start_new_session=True,
                    )
                )
        pids = [p.pid for p in procs]
        self.store.add_job(self.record.id, self.record.id, pid=os.getpid(), children=pids)
        held = {n.name: self._held_gpus(n) for n in nodes}
        for name, count in held.items():
            self.event(JOB_PLACED, f"placed on {name} ({count} GPU(s))", name,
                       restart_count=restart, gpus=count, node_class=self.node_class)  # fmt: skip
        outcome = self._watch(procs, names, since)
        budget_stop = outcome.kind == "cancelled" and self.stop_reason.startswith(BUDGET_STOP)
        cause = meter.release_cause(outcome.kind, budget_stop, self.moving)
        for name, count in held.items():
            self.event(JOB_RELEASED, f"released {name}: {cause} (exit {outcome.exit_code})", name,
                       restart_count=restart, gpus=count, exit_code=outcome.exit_code,
                       cause=cause)  # fmt: skip
        return outcome

    def _held_gpus(self, where: NodeInfo) -> int:
        """The GPUs the run holds on `where`, as the platform bills them: what it asked for per
        node, within the node's own (the emulator's record of it)."""
        asked = int(self.record.spec.resources.gpus_per_node)
        return min(asked, where.gpus) if where.gpus > 0 else asked

    def check_budget(self) -> None:
        """With a ``budget_usd``: the one rule of `tgnb.runs.budget` on the run's events, at the
        prices of its launch: a ``BudgetNotice`` once at `tgnb.prices.NOTICE_FRACTION` of
        it, and at the budget a ``BudgetReached`` and the run stopped as a cancel does (SIGTERM: it checkpoints)."""
        if self.stop_requested:
            return
        evs = cursor.events(self.run_dir / "events.jsonl", run=self.record.name)
        found = budget.check(self.record.spec, evs)
        if found is None:
            return
        for reason, line in found.due:
            self.event(reason, line, **found.data)
            if reason == BUDGET_NOTICE:
                print(line, flush=True)
        if found.reached:
            self.stop_requested = True
            self.stop_reason = found.stop_reason
            print(self.stop_reason, flush=True)
            self.event(SIGNAL_SENT, f"SIGTERM: {self.stop_reason}", budget=True, **found.data)

    def _signal(self, procs: Sequence[Proc], sig: signal.Signals) -> None:
        """SIGTERM to the process groups (torchrun passes it on to its workers); SIGKILL to the
        run's whole process tree (`tgnb.backends.local.proctree`): torchrun's workers are in sessions of
        their own, and would go on training once their agent is killed."""
        if sig == signal.SIGKILL:
            proctree.signal_run(self.record.id, [p.pid for p in procs if p.poll() is None], sig)
            return
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)

    def _watch(self, procs: Sequence[Proc], names: Sequence[str], since: int = 0) -> Outcome:
        preempted: str | None = None
        killed = False
        stop_at: float | None = None
        last_api = 0.0
        # on standard nodes after a move, back to preemptible ones as soon as the policy would
        # start there (`decide`): the attempt is stopped, checkpoints and restarts there
        back = placing.PlacementLoop(self.policy, Running(self))
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if self.stop_requested and stop_at is None:
                self._signal(procs, signal.SIGTERM)
                stop_at = now + STOP_GRACE_SECONDS
            if stop_at is not None and now > stop_at:
                self._signal(procs, signal.SIGKILL)
            if now - last_api > 1.0:
                self.refresh()
                last_api = now
                self.check_budget()
                if not self.moving and back.step() and self.moving:
                    self._signal(procs, signal.SIGTERM)  # it checkpoints and exits 75
            for name in names:
                node = self._cache.get(name) or self._gone(name)
                if preempted is None and node.notified():
                    preempted = name
                    if self.slurm:
                        self.store.set_state(
                            self.record.id, JobState.RUNNING, f"{name} drained", node=name
                        )
                    else:
                        self._signal(procs, signal.SIGTERM)
                        self.event(SIGNAL_SENT, f"SIGTERM: {name} is being preempted", name)
                if not killed and (node.removed() or name not in self._cache):
                    killed = True
                    preempted = preempted or name
                    if any(p.poll() is None for p in procs):
                        self.event(JOB_KILLED, f"SIGKILL: {name} was removed", name)
                    self._signal(procs, signal.SIGKILL)
            time.sleep(self.poll)
        codes = [p.wait() for p in procs]
        # nothing of this attempt outlives it (a worker whose agent died): the next starts alone
        if left := proctree.kill_run(self.record.id):
            print(f"killed {left} process(es) the attempt left behind", flush=True)
        if preempted is None:  # the process may have heard the notice before this loop did
            preempted = next(
                (n for n in names if self._cache.get(n) and self._cache[n].notified()), None
            )
            if preempted is not None and self.slurm:
                self.store.set_state(
                    self.record.id, JobState.RUNNING, f"{preempted} drained", node=preempted
                )
        if stop_at is not None:
            return Outcome("cancelled", codes[0])
        code = next((c for c in codes if c != 0), 0)
        if any(self.policy.is_resume(c) for c in codes):
            code = next(c for c in codes if self.policy.is_resume(c))
        signalled = preempted is not None or self.moving  # SIGTERM sent, or a drain notice
        v = classify(code, Attempt.read(self.run_dir, since), self.policy.resume_codes,
                     signalled=signalled, lost=killed)  # fmt: skip
        if v.kind == "succeeded":
            return Outcome("succeeded", verdict=v)
        if v.kind == "failed":
            return Outcome("failed", code, verdict=v)
        return Outcome("requeue", code, preempted or names[0], verdict=v)

    # -- the run -------------------------------------------------------------------------------

    def _on_stop(self, *_: Any) -> None:
        self.stop_requested = True
        if self._preloading:  # importing the training stack takes seconds: not for a stopped run
            self._preloading = False
            raise _Stopped

    def _forks_warm(self) -> bool:
        """Whether this run's starts may be forked warm, so that importing the training stack
        first pays: one node and a built-in task alone. A script runs under torchrun and a command
        is its own program: both start a fresh interpreter anyway, and the import (seconds) would
        only delay every launch of theirs."""
        res = self.record.spec.resources
        if res.nodes != 1 or os.environ.get(TRAIN_MODULE_ENV):
            return False
        gpus = node_gpus(res.gpus_per_node, [])  # at most this many on its one node
        return not node.processes(self.train, 1, gpus).torchrun

    def main(self) -> int:
        """Run until the run has finished; returns the supervisor's exit status."""
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.environ.update({k: str(v) for k, v in self.record.spec.env.items()})
        if self._forks_warm():
            self._preloading = not self.stop_requested
            try:
                self.warm = self._preloading and preload(TRAIN_MODULE)
            except _Stopped:
                self.warm = False
            finally:
                self._preloading = False
        restart = self.record.restart_count
        if self.train.fault_tolerance:  # replica groups under a lighthouse (issue 50)
            return groups.run(self, restart)
        rid = self.record.id
        failures = 0
        while True:
            nodes = self.place(restart)
            if nodes is None:
                detail = self.stop_reason or "stopped before it was placed"
                self.store.set_state(rid, JobState.CANCELLED, detail)
                return 0
            self.reestimate(nodes, restart)
            outcome = self.attempt(nodes, restart)
            code = outcome.exit_code
            if outcome.kind == "succeeded":
                self.store.set_state(rid, JobState.SUCCEEDED, "finished", exit_code=0)
                return 0
            if outcome.kind == "cancelled":
                detail = self.stop_reason or "stopped"
                if detail.startswith(BUDGET_STOP):  # one exit code for a budget stop, everywhere
                    code = int(Exit.STOPPED)
                self.store.set_state(rid, JobState.CANCELLED, detail, exit_code=code)
                return 0
            if outcome.kind == "failed":  # counted; preemptions never are
                failures += 1
                if not self.policy.restart_after_failure(failures, code):
                    detail = failed_detail(code, outcome.verdict)
                    self.store.set_state(rid, JobState.FAILED, detail, exit_code=code)
                    return 1
                wait_s = self.policy.backoff(failures)
                budget = self.policy.max_restarts
                why = f"exit code {code}: failure {failures} of {budget}, restarting in {wait_s:.0f} s"
                self.event(RUN_FAILED_RESTARTING, why, failures=failures, max_restarts=budget,
                           backoff_s=wait_s, exit_code=code)  # fmt: skip
                self.store.set_state(rid, JobState.PENDING, why, exit_code=code)
                until = time.monotonic() + wait_s
                while not self.stop_requested and time.monotonic() < until:
                    time.sleep(min(self.poll, max(0.0, until - time.monotonic())))
                restart += 1
                continue
            restart += 1
            node = outcome.node
            # moving: stopped on purpose to go back (`Running`)
            what, moved = requeued(outcome.verdict, node, self.slurm, self.moving)
            self.event(
                RUN_REQUEUED,
                f"{what} (exit {code})",
                node,
                restart_count=restart,
                exit_code=code,
                **moved,
            )
            self.store.set_state(rid, JobState.REQUEUED, what, node=node, restart_count=restart)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tgnb.backends.local.supervisor")
    p.add_argument("--home", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--type", default="KUBERNETES")
    p.add_argument("--poll", type=float, default=0.2)
    args = p.parse_args(argv)
    home = Path(args.home)
    store = RunStore(home)
    source = NodeSource(args.cluster, endpoint_for(home))
    gone = HomeEmulator(home, float(os.environ.get("TGNB_EMULATOR_GONE_S") or EMULATOR_GONE_S))
    reader = cluster_reader(args.cluster, endpoint_for(home))
    sup = Supervisor(store, args.run, source, cluster_type=args.type, poll=args.poll,
                     emulator_stopped=gone, cluster_state=reader)  # fmt: skip
    print(json.dumps({"supervisor": os.getpid(), "run": sup.record.name}), flush=True)
    try:
        return sup.main()
    except Exception as exc:
        sup.store.set_state(sup.record.id, JobState.FAILED, f"supervisor error: {exc}")
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
