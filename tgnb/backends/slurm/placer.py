"""The placer: the part of a Slurm run's recovery policy that acts while the run's job waits.

An sbatch job keeps the node class it asked for while it runs (``scontrol update`` cannot change
a running job's ``Features``), and Slurm 22.05 has no ``--prefer``; nothing in the job's own script
runs while it is pending. So a run whose policy moves between node classes
(``when_short="standard"``, or a ``deadline``: `needs_placer`) gets a second, small job: one CPU,
``--requeue``, no GPU, submitted right after the run's (`render_placer`), running
``python -m tgnb.backends.slurm placer.json JOBID`` until the run's job has ended.

Every few seconds it reads the run's job (``scontrol show job``) and, while that job is pending,
the cluster's nodes (``scontrol show node``): each node is of the class its ``preemptible``
feature says (Together's standard nodes carry no feature), free when it is up, not drained and
has the CPUs and GPUs the run needs. With those and the run's own progress it calls the one rule
every engine follows (`tgnb.runs.recovery.decide`) and makes the pending job ask for it:

- preemptible nodes (the run was submitted with ``--constraint=preemptible``, and a job that was
  moved gets it back at its next pending stretch: its next restart goes back to them);
- standard nodes, after `RecoveryPolicy.wait_s` without preemptible capacity or when a deadline is
  at risk: the constraint is cleared (``Features=``), so the job starts on the nodes that are free,
  which are then standard ones.

While a job that was moved runs on standard nodes, the placer reads the cluster's nodes too: as
soon as the rule would start it on preemptible ones (back to preemptible), it requeues the job
(``scontrol requeue``: Slurm signals it, it checkpoints), and the job's next pending stretch asks
for preemptible nodes again.

The loop is the one every engine runs (`tgnb.runs.placing.PlacementLoop`; `SlurmPlacement` is its
`Engine`): each
decision, once per change, is a ``RecoveryDecided`` line in the run's ``events.jsonl``, as the
local supervisor writes it. A placer that is itself requeued (its node was reclaimed) starts its wait again: it
keeps no state but the job's own.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tgnb.backends.base import RunSpec
from tgnb.backends.slurm.commands import CommandRunner
from tgnb.backends.slurm.records import job_status, parse_fields
from tgnb.events import RECOVERY_DECIDED, Event, utcnow
from tgnb.runs import node, placing
from tgnb.runs.recovery import Decision, Facts, RecoveryPolicy, progress
from tgnb.runs.runfile import PlacerConfig, RunFile

SCRIPT_NAME = "placer.sbatch"
CONFIG_NAME = "placer.json"
#: The placer's job id, written by `SlurmBackend.submit` (cancelled with the run).
JOB_FILE = ".tgnb-placer"
PREEMPTIBLE = "preemptible"
#: Node state flags (``State=IDLE+DRAIN``) under which a node takes no new job.
_UNSCHEDULABLE = frozenset(
    {"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING",
     "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED",
     "RESERVED", "FUTURE", "INVALID_REG", "PLANNED"}
)  # fmt: skip


def needs_placer(policy: RecoveryPolicy) -> bool:
    """Whether the run moves between node classes, which only a placer can do on Slurm."""
    return policy.when_short == "standard" or policy.deadline is not None


def side_job_head(spec: RunSpec, run_dir: object, role: str, mem: str) -> list[str]:
    """The ``#SBATCH`` directives of a run's one-CPU side job (its placer, its lighthouse):
    named ``RUN-ROLE``, its output appended in the run directory, requeued with the run."""
    return [
        f"--job-name={spec.name}-{role}",
        f"--output={run_dir}/{role}-%j.out",
        "--open-mode=append",
        f"--chdir={run_dir}",
        "--requeue",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        f"--mem={mem}",
    ]


def render_placer(
    spec: RunSpec, run_dir: str, python: str, launched: float, poll_s: float = 5.0
) -> tuple[str, str]:
    """``(script, config_json)`` of the run's placer; its job id argument is the run's job."""
    head = side_job_head(spec, run_dir, "placer", "256M")
    head += [f"--partition={spec.partition}"] if spec.partition else []
    head += [f"--account={spec.account}"] if spec.account else []
    script = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in head),
        "#SBATCH --export=ALL",
        f"# Rendered by tgnb for run {spec.name}: places each restart of its job (the job id is",
        "# this script's argument) on a node class by the run's recovery policy; ends with the run.",
        f'exec {shlex.quote(python)} -m tgnb.backends.slurm {run_dir}/{CONFIG_NAME} "$1"',
    ]
    run = RunFile(spec, launched)  # placer.json: a view of it, with Slurm's own keys
    config = run.placer_config(
        poll_s, cpus_per_task=spec.resources.cpus_per_task or 1, partition=spec.partition
    )
    return "\n".join(script) + "\n", config.to_json()


# -- what the placer sees -------------------------------------------------------------------------


def _tres(value: str, key: str) -> int:
    """The count of `key` in a TRES list (``cpu=2,mem=4000M,gres/gpu=8``), 0 when absent."""
    for part in value.split(","):
        name, _, count = part.partition("=")
        if name == key and count.isdigit():
            return int(count)
    return 0


@dataclass(frozen=True)
class SlurmNode:
    """One node of ``scontrol show node -o``, as the placer judges it."""

    name: str
    kind: str  # "preemptible" or "standard"
    up: bool  # takes new jobs: not drained, down or otherwise held
    free_cpus: int
    gpus: int
    free_gpus: int
    partitions: tuple[str, ...]

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> SlurmNode:
        features = f.get("ActiveFeatures") or f.get("AvailableFeatures") or ""
        state = f.get("State", "").upper()
        base, *flags = state.split("+")
        up = base.rstrip("*~#$@%!^-") in ("IDLE", "MIXED") and not (
            base.endswith("*") or _UNSCHEDULABLE & set(flags)
        )
        cpus = int(f.get("CPUTot", "0") or 0) - int(f.get("CPUAlloc", "0") or 0)
        gpus = _tres(f.get("CfgTRES", ""), "gres/gpu")
        return cls(
            name=f.get("NodeName", ""),
            kind=PREEMPTIBLE if PREEMPTIBLE in features.split(",") else "standard",
            up=up,
            free_cpus=cpus,
            gpus=gpus,
            free_gpus=gpus - _tres(f.get("AllocTRES", ""), "gres/gpu"),
            partitions=tuple(p for p in f.get("Partitions", "").split(",") if p),
        )


def slurm_facts(
    config: PlacerConfig,
    nodes: Sequence[SlurmNode],
    short_for: float,
    run_dir: str | Path,
    now: float,
    job_partitions: Sequence[str] = (),
) -> Facts:
    """`tgnb.runs.recovery.Facts` of a pending Slurm run: the nodes of each class that could take
    one of its tasks now, the preemptible GPUs up, and the run's progress. A node counts only in
    the job's partitions: `job_partitions`, as the controller holds the job (a job submitted with
    no ``--partition`` is in the default one), else the run's `partition`."""
    gpus, cpus = config.gpus_per_node, config.cpus_per_task or 1
    wanted = set(job_partitions) or ({config.partition} if config.partition else set())

    def fits(n: SlurmNode) -> bool:
        in_partition = not wanted or not n.partitions or bool(wanted & set(n.partitions))
        return n.up and in_partition and n.free_cpus >= cpus and n.free_gpus >= gpus

    free = {k: sum(1 for n in nodes if n.kind == k and fits(n)) for k in (PREEMPTIBLE, "standard")}
    return Facts(
        nodes=config.nodes,
        min_nodes=config.min_nodes,
        free=free,
        short_for_s=short_for,
        allocated_gpus=sum(n.gpus for n in nodes if n.kind == PREEMPTIBLE and n.up)
        if gpus
        else None,
        desired_gpus=config.nodes * gpus if gpus else None,
        gpus_per_node=gpus,
        **progress(run_dir, config.launched, config.max_steps, now),
    )


# -- the loop -------------------------------------------------------------------------------------


class SlurmPlacement:
    """Follows one run's job (`job`) with the settings of its ``placer.json`` (`config_path`): the
    `tgnb.runs.placing.Engine` of a Slurm run, run by the one placement loop."""

    def __init__(self, config_path: str | Path, job: str, runner: CommandRunner | None = None):
        self.config_path = Path(config_path)
        self.config = PlacerConfig.load(self.config_path)
        self.run_dir = self.config_path.parent
        self.policy = self.config.policy
        self.job = str(job)
        self.runner = runner or CommandRunner(None)
        self.pending_since: float | None = None
        self.ended = False
        self.fields: dict[str, str] = {}  # the run's job, as last observed
        self.running_on: str | None = None  # the class of its nodes, once seen running
        self.loop = placing.PlacementLoop(self.policy, self)

    def _show(self, *what: str) -> list[dict[str, str]] | None:
        proc = self.runner.run(["scontrol", "show", *what, "-o"], check=False)
        if proc.returncode != 0:
            return None
        return [parse_fields(line) for line in proc.stdout.splitlines() if line.strip()]

    def observe(self) -> Facts | None:
        """The facts of the run's pending job, or of its job running on standard nodes after a
        move; None while it runs where it asked to (or once it has ended)."""
        now = time.time()
        jobs = self._show("job", self.job)
        if jobs is None or not jobs or job_status(jobs[0]).state.finished:
            self.ended = True  # the controller no longer knows the job, or it has finished
            return None
        self.fields = jobs[0]
        state = self.fields.get("JobState", "")
        if not state.startswith("PENDING"):  # running, or requeued
            self.pending_since = None
            if not state.startswith("RUNNING") or PREEMPTIBLE in self.fields.get("Features", ""):
                self.running_on = None
                return None
            return self._running(now)
        self.pending_since, self.running_on = self.pending_since or now, None
        nodes = self._show("node")
        if nodes is None:
            raise placing.NoAnswer
        return slurm_facts(
            self.config, [SlurmNode.from_fields(n) for n in nodes], now - self.pending_since,
            self.run_dir, now, self._partitions(),
        )  # fmt: skip

    def _partitions(self) -> tuple[str, ...]:
        """The partitions the controller holds the run's job in (``Partition=low``)."""
        return tuple(p for p in self.fields.get("Partition", "").split(",") if p)

    def _running(self, now: float) -> Facts | None:
        """The facts of the job running after a move (no ``preemptible`` constraint) on standard
        nodes: the class of its nodes as they were when this placer first saw it run (standard
        when any of them was)."""
        nodes = self._show("node")
        if nodes is None:
            raise placing.NoAnswer
        seen = [SlurmNode.from_fields(n) for n in nodes]
        if self.running_on is None:
            hosts = self._show_hostnames(self.fields.get("NodeList", ""))
            if hosts is None:
                raise placing.NoAnswer
            mine = [n.kind for n in seen if n.name in hosts]
            self.running_on = "standard" if "standard" in mine else PREEMPTIBLE
        if self.running_on == PREEMPTIBLE:
            return None  # it runs on preemptible nodes anyway
        f = slurm_facts(self.config, seen, 0.0, self.run_dir, now, self._partitions())
        return dataclasses.replace(f, current="standard")

    def _show_hostnames(self, nodelist: str) -> set[str] | None:
        if "[" not in nodelist:
            return {h for h in nodelist.split(",") if h}
        proc = self.runner.run(["scontrol", "show", "hostnames", nodelist], check=False)
        return set(proc.stdout.split()) if proc.returncode == 0 else None

    def act(self, d: Decision) -> Decision:
        """Make the pending job ask for the node class decided (its ``Features``); requeue a job
        that goes back to preemptible nodes."""
        if d.action == "keep":
            return d
        if self.fields.get("JobState", "").startswith("RUNNING"):  # back to preemptible
            proc = self.runner.run(["scontrol", "requeue", self.job], check=False)
            if proc.returncode != 0:  # it ended meanwhile, or the controller is busy
                print(f"tgnb placer: scontrol requeue failed: {proc.stderr.strip()}", flush=True)
                raise placing.NoAnswer
            return d
        to_standard = d.action == "start" and d.node_class == "standard"
        if to_standard == (PREEMPTIBLE in self.fields.get("Features", "")):
            features = "" if to_standard else PREEMPTIBLE
            proc = self.runner.run(
                ["scontrol", "update", f"JobId={self.job}", f"Features={features}"], check=False
            )
            if proc.returncode != 0:  # it started meanwhile, or the controller is busy
                print(f"tgnb placer: scontrol update failed: {proc.stderr.strip()}", flush=True)
                raise placing.NoAnswer
        return d

    def record(self, d: Decision) -> None:
        ev = Event(
            utcnow(), "tgnb", RECOVERY_DECIDED, d.reason, run=self.config.run,
            data={**d.data(), "job_id": self.job},
        )  # fmt: skip
        with open(self.run_dir / node.EVENTS, "a", encoding="utf-8") as fh:
            fh.write(ev.to_json() + "\n")
        print(f"tgnb placer: {d.reason}", flush=True)

    def done(self) -> bool:
        return self.ended

    def run(self) -> int:
        print(f"tgnb placer: following job {self.job} of run {self.config.run}", flush=True)
        self.loop.run(self.config.poll_s)
        print(f"tgnb placer: job {self.job} has ended", flush=True)
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m tgnb.backends.slurm PLACER_JSON JOBID", file=sys.stderr)
        return 2
    return SlurmPlacement(args[0], args[1]).run()
