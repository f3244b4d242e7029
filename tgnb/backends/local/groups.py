"""A fault-tolerant run on the local engine (issue 50, ``fault_tolerance="torchft"``): the run as
replica groups under a TorchFT lighthouse, with the contract of `tgnb.runs.ft`.

- The lighthouse (``torchft_lighthouse``) is the run's coordinator: it runs beside the emulator's
  fleet, on this machine, never on an emulated preemptible node, bound to a free loopback port.
  Its log (``lighthouse.log`` in the run directory) is read for the quorums (`quorums`).
- Each placed node runs one group: its own torchrun (or the program alone) with its own rendezvous
  and store, `tgnb.runs.ft.group_env` in its environment, and a process tag of its own, so one
  group is signalled or killed without touching the others.
- A preemption notice on a KUBERNETES-type cluster sends that group SIGTERM (its program leaves
  at once, or tgnb's runtime at its next step boundary); the node's removal kills what is left of
  it. A group that ends without a notice (a crash, a kill) is a counted failure, within the
  policy's ``max_restarts``. No other group is signalled: the survivors go on, after the
  lighthouse's heartbeat timeout when the group vanished without leaving.
- A missing group is placed again, under the same index, by the run's recovery policy decided
  group by group (`tgnb.backends.local.groupplace`): on a free preemptible node, else after
  ``wait_s`` on a standard one with ``when_short="standard"`` (or a ``deadline`` behind
  schedule), claimed in the run store as any placement; it heals from a live peer. A group on a
  standard node goes back to a preemptible one once one is free: it leaves (cause ``moved``, no
  failure, no preemption, its node released ``moved``) and its replacement heals. Each group's
  ``JobPlaced`` says the class of its node, which the meter prices.
- The run succeeds when a group finishes (exit 0, no notice) and every other has ended; it is
  cancelled by a stop (SIGTERM to every group, SIGKILL after the grace period). At its budget
  (`Supervisor.check_budget`, once a second here) every group is stopped the same way: each
  leaves with cause ``budget``, its node released for the budget, and the run ends cancelled
  ("budget reached at $X of $Y", exit 77), never as a preemption.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from tgnb.backends.base import JobState
from tgnb.backends.local import proctree
from tgnb.backends.local.command import free_port, node_gpus, train_command
from tgnb.backends.local.groupplace import MOVED, GroupMove, GroupPlacement
from tgnb.backends.local.nodes import NodeInfo
from tgnb.backends.local.quorums import QuorumReader, StepRows, group_of
from tgnb.events import (
    GROUP_JOINED,
    GROUP_LEFT,
    JOB_KILLED,
    JOB_PLACED,
    JOB_RELEASED,
    LIGHTHOUSE_STARTED,
    SIGNAL_SENT,
)
from tgnb.runs import ft, meter, node
from tgnb.runs.budget import BUDGET_STOP
from tgnb.runs.placing import PlacementLoop

if TYPE_CHECKING:
    from tgnb.backends.local.supervisor import Supervisor

LIGHTHOUSE_LOG = "lighthouse.log"
#: A group's leaving stopped on purpose (`Group.cause`) -> its node's release cause (`meter`).
_STOPS = {"stopped": meter.CANCELLED, "budget": meter.BUDGET, MOVED: meter.MOVED}
GRACE_S = 30.0
NO_TORCHFT = (
    "fault_tolerance='torchft' needs TorchFT where the run starts: pip install 'tgnb[torchft]'"
)


@dataclass
class Group:
    index: int
    where: NodeInfo
    proc: subprocess.Popen[bytes]
    tag: str  # its processes' tag (`proctree`)
    started: float  # epoch seconds
    node_class: str = "preemptible"  # of its node
    cause: str = ""  # why the engine ended it: "notice", "removed", "stopped", "moved"


def lighthouse_program() -> str | None:
    """TorchFT's lighthouse beside this interpreter, else on the PATH; None without TorchFT."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    return str(beside) if beside.exists() else shutil.which("torchft_lighthouse")


class Groups:
    """One fault-tolerant run: the lighthouse and a group per node, until the run ends."""

    def __init__(self, sup: Supervisor, restart: int) -> None:
        self.sup = sup
        self.restart = restart
        self.spec = sup.record.spec
        self.count = self.spec.resources.nodes  # NUM_REPLICA_GROUPS
        self.groups: dict[int, Group] = {}
        self.started: dict[int, float] = {}
        self.failures = 0
        self.finished = False
        self.lighthouse: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.serial = 0
        #: the placement loop of each missing group, and the move back of each on a standard node
        self.placing: dict[int, PlacementLoop] = {}
        self.moves: dict[int, PlacementLoop] = {}
        self.config = sup.run_dir / node.CONFIG
        #: the quorum's steps as metrics rows, for a program that records none (never imports tgnb)
        self.rows = StepRows(sup.run_dir / node.METRICS, sup.run_dir / "events.jsonl")
        self.reader = QuorumReader(
            sup.run_dir / LIGHTHOUSE_LOG,
            lambda reason, line, data: sup.event(reason, line, **data),
            self.started,
            each=self.rows.seen,
        )

    # -- the lighthouse ------------------------------------------------------------------------

    def start_lighthouse(self) -> None:
        program = lighthouse_program()
        if program is None:
            raise RuntimeError(NO_TORCHFT)
        options = ft.lighthouse_options(self.spec.env)
        port = free_port()
        cmd = ft.lighthouse_command(f"127.0.0.1:{port}", options, program=program)
        env = dict(os.environ, **{proctree.TAG_ENV: proctree.tag(self.sup.record.id, -1)})
        with open(self.sup.run_dir / LIGHTHOUSE_LOG, "ab") as log:
            self.lighthouse = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.sup.run_dir, env=env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.lighthouse.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            time.sleep(0.05)
        if self.lighthouse.poll() is not None:
            raise RuntimeError(
                f"the lighthouse exited ({self.lighthouse.returncode}): see {LIGHTHOUSE_LOG}"
            )
        self.url = ft.lighthouse_url("127.0.0.1", port)
        self.sup.event(
            LIGHTHOUSE_STARTED,
            f"lighthouse at {self.url} (a vanished group is out after "
            f"{options.heartbeat_timeout_ms} ms)",
            address=self.url, heartbeat_timeout_ms=options.heartbeat_timeout_ms,
            join_timeout_ms=options.join_timeout_ms,
        )  # fmt: skip

    # -- groups --------------------------------------------------------------------------------

    def start(self, index: int, where: NodeInfo, replacement: bool, node_class: str) -> None:
        sup = self.sup
        config = self.config
        gpus = node_gpus(self.spec.resources.gpus_per_node, [where.gpus])
        model = node.processes(sup.train, 1, gpus)
        cmd = train_command(config, sup.run_dir, model, 1, 0, f"127.0.0.1:{free_port()}")
        self.serial += 1
        tag_id = f"{sup.record.id}.g{index}.{self.serial}"
        env = sup._env(where, self.restart)
        env.update(ft.group_env(self.url, index, self.count))
        env[proctree.TAG_ENV] = proctree.tag(tag_id, self.restart)
        with open(sup.run_dir / node.LOG, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=sup.run_dir, env=env, start_new_session=True,
            )  # fmt: skip
        now = time.time()
        self.groups[index] = Group(index, where, proc, tag_id, now, node_class)
        self.started[index] = now
        self.sync_jobs()
        if node_class == "standard":
            self.moves[index] = PlacementLoop(sup.policy, GroupMove(self, index))
        held = sup._held_gpus(where)
        sup.event(JOB_PLACED, f"placed group {index} on {where.name} ({held} GPU(s), {node_class})",
                  where.name, restart_count=self.restart, gpus=held, node_class=node_class,
                  group=index)  # fmt: skip
        what = "replacement group" if replacement else "group"
        sup.event(GROUP_JOINED, f"{what} {index} started on {where.name} ({node_class})",
                  where.name, group=index, replacement=replacement,
                  node_class=node_class)  # fmt: skip

    def move(self, index: int) -> None:
        """Group `index` leaves its standard node to go back to a preemptible one (`GroupMove`):
        SIGTERM, its leaving neither a failure nor a preemption."""
        g = self.groups[index]
        g.cause = MOVED
        self.kill(g, signal.SIGTERM)
        self.sup.event(SIGNAL_SENT, f"SIGTERM: group {index} moves back to a preemptible node",
                       g.where.name, group=index, moved=True)  # fmt: skip

    def sync_jobs(self) -> None:
        pids = [g.proc.pid for g in self.groups.values()]
        if self.lighthouse is not None:
            pids.append(self.lighthouse.pid)
        self.sup.store.add_job(
            self.sup.record.id, self.sup.record.id, pid=os.getpid(), children=pids
        )

    def kill(self, g: Group, sig: signal.Signals) -> None:
        if sig == signal.SIGKILL:
            proctree.signal_run(g.tag, [g.proc.pid] if g.proc.poll() is None else [], sig)
        elif g.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g.proc.pid, sig)

    def ended(self, g: Group, code: int) -> None:
        """Group `g`'s processes ended with `code`: its node given back, its leaving recorded."""
        sup = self.sup
        proctree.kill_run(g.tag)  # nothing of it stays behind
        del self.groups[g.index]
        self.sync_jobs()
        if g.cause in _STOPS:
            cause, release = g.cause, _STOPS[g.cause]
        elif g.cause:
            cause, release = g.cause, meter.PREEMPTED
        elif code == 0:
            cause, release = "finished", meter.DONE
            self.finished = True
            self.stop_unhealed()
        else:
            cause, release = "lost", meter.FAILED
        held = sup._held_gpus(g.where)
        sup.event(JOB_RELEASED, f"released {g.where.name}: group {g.index} {cause} (exit {code})",
                  g.where.name, restart_count=self.restart, gpus=held, exit_code=code,
                  cause=release, group=g.index)  # fmt: skip
        sup.event(GROUP_LEFT, f"group {g.index} left: {cause} (exit {code})", g.where.name,
                  group=g.index, cause=cause, exit_code=code)  # fmt: skip
        if cause == "lost":
            self.failures += 1

    def stop_unhealed(self) -> None:
        """The run finished: a group not yet in a quorum (a replacement still starting) would
        only train alone from step 0; it is stopped."""
        self.reader.poll()
        last = self.reader.last
        inside = {group_of(r) for r in last.members} if last is not None else set()
        for g in self.groups.values():
            if g.index not in inside and not g.cause:
                g.cause = "stopped"
                self.kill(g, signal.SIGTERM)

    def replace(self) -> None:
        """Step each missing group's placement (`GroupPlacement`, by the run's recovery policy),
        and each standard group's move back (`GroupMove`)."""
        for index, move in list(self.moves.items()):
            if not (self.finished or self.sup.stop_requested) and index in self.groups:
                move.step()
                if not move.engine.done():
                    continue
                self.move(index)
            del self.moves[index]
        missing = [i for i in range(self.count) if i not in self.groups]
        for index in list(self.placing):
            if index not in missing:
                del self.placing[index]
        if not missing or self.finished or self.sup.stop_requested:
            return
        if self.failures and not self.sup.policy.restart_after_failure(self.failures, 1):
            return
        for index in missing:
            if index not in self.placing:  # missing since now
                self.placing[index] = PlacementLoop(self.sup.policy, GroupPlacement(self, index))
            self.placing[index].step()
            chosen = cast(GroupPlacement, self.placing[index].engine).chosen
            if chosen is not None:
                self.start(index, chosen[0], replacement=True, node_class=chosen[1])

    # -- the run -------------------------------------------------------------------------------

    def watch(self, g: Group) -> None:
        sup = self.sup
        where = sup._cache.get(g.where.name) or sup._gone(g.where.name)
        if not g.cause and where.notified():
            g.cause = "notice"
            if not sup.slurm:
                self.kill(g, signal.SIGTERM)
                sup.event(SIGNAL_SENT, f"SIGTERM: {where.name} is being preempted (group {g.index})",
                          where.name, group=g.index)  # fmt: skip
        if where.removed() or where.name not in sup._cache:
            g.cause = g.cause or "removed"
            if g.proc.poll() is None:
                sup.event(JOB_KILLED, f"SIGKILL: {where.name} was removed (group {g.index})",
                          where.name, group=g.index)  # fmt: skip
                self.kill(g, signal.SIGKILL)

    def run(self, nodes: list[NodeInfo]) -> int:
        sup, rid = self.sup, self.sup.record.id
        self.config = sup._write_config()  # the run file every group starts with
        try:
            self.start_lighthouse()
        except (RuntimeError, ValueError) as exc:
            sup.store.set_state(rid, JobState.FAILED, str(exc), exit_code=int(node.Exit.BAD_CONFIG))
            return 1
        for index, where in enumerate(nodes[: self.count]):
            self.start(index, where, replacement=False, node_class=sup.node_class)
        stop_at: float | None = None
        last_api = 0.0
        while self.groups:
            now = time.monotonic()
            if sup.stop_requested and stop_at is None:
                stop_at = now + GRACE_S
                # every group stops at the budget: a budget stop, never a preemption
                why = "budget" if sup.stop_reason.startswith(BUDGET_STOP) else "stopped"
                for g in self.groups.values():
                    g.cause = g.cause or why
                    self.kill(g, signal.SIGTERM)
            if stop_at is not None and now > stop_at:
                for g in self.groups.values():
                    self.kill(g, signal.SIGKILL)
            if now - last_api > 1.0:
                last_api = now
                sup.refresh()
                sup.check_budget()
                self.replace()
            for g in list(self.groups.values()):
                self.watch(g)
                code = g.proc.poll()
                if code is not None:
                    self.ended(g, code)
            self.reader.poll()
            if not self.groups and not self.finished and stop_at is None:
                if self.failures and not sup.policy.restart_after_failure(self.failures, 1):
                    break  # preemptions never count: a run whose groups were all preempted waits
                self.replace()
            time.sleep(sup.poll)
        self.reader.poll()
        self.rows.flush(finished=self.finished and stop_at is None)
        self.close()
        if stop_at is not None:
            detail = sup.stop_reason or "stopped"
            # one exit code for a budget stop, everywhere (`tgnb.runs.budget.settle`)
            code = int(node.Exit.STOPPED) if detail.startswith(BUDGET_STOP) else None
            sup.store.set_state(rid, JobState.CANCELLED, detail, exit_code=code)
            return 0
        if self.finished:
            sup.store.set_state(rid, JobState.SUCCEEDED, "finished", exit_code=0)
            return 0
        detail = f"every replica group failed ({self.failures} failure(s))"
        sup.store.set_state(rid, JobState.FAILED, detail, exit_code=int(node.Exit.FAILED))
        return 1

    def close(self) -> None:
        for g in list(self.groups.values()):
            self.kill(g, signal.SIGKILL)
        if self.lighthouse is not None and self.lighthouse.poll() is None:
            self.lighthouse.terminate()
            try:
                self.lighthouse.wait(5)
            except subprocess.TimeoutExpired:
                self.lighthouse.kill()


def run(sup: Supervisor, restart: int) -> int:
    """Run `sup`'s fault-tolerant run to its end; the supervisor's exit status."""
    nodes = sup.place(restart)
    if nodes is None:
        sup.store.set_state(
            sup.record.id, JobState.CANCELLED, sup.stop_reason or "stopped before it was placed"
        )
        return 0
    return Groups(sup, restart).run(nodes)
