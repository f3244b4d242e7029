"""A run as TorchFT replica groups on Slurm (``fault_tolerance="torchft"``, issue 50; the contract
is `tgnb.runs.ft`): one job per group, the lighthouse in a job of its own on a standard node.

- The groups are one job array, ``--array=0-(N-1)``: each task is a job of its own (its own id,
  ``--requeue``, on the preemptible nodes, ``--nodes=1``), so Slurm preempts and requeues one group
  and not the others, and the run keeps one id, the array's. Each task runs the run's sbatch
  script (`tgnb.backends.slurm.render`) as a one-node run (`group_spec`: torchrun with its own
  rendezvous on the node), group ``$SLURM_ARRAY_TASK_ID``, and counts its own failures.
- The lighthouse is a second job (`render_lighthouse`): one CPU, no GPU, ``--requeue``, kept off
  the preemptible nodes -- ``--partition`` when the cluster has a standard partition
  (``SlurmBackend(lighthouse_partition=...)``), else ``--exclude`` of the nodes with the
  ``preemptible`` feature when it is submitted (Together's standard nodes carry no feature, and
  Slurm's ``--constraint`` has no "not"). It starts ``torchft_lighthouse`` on a free port and,
  once the port answers, writes ``HOST:PORT`` to `ADDRESS_FILE` in the run directory (shared
  storage): that file is how the groups find it, at every start, wherever Slurm placed it. It
  stops when the groups' array has left the queue (`GROUPS_JOB_FILE`).
- The groups are submitted with ``--dependency=after:LIGHTHOUSE`` (they start once the lighthouse
  has started, never on preemptible nodes while it still waits for a standard one) and each
  waits for `ADDRESS_FILE` before it starts its program (at most `ADDRESS_WAIT_S`: then a
  failure, counted and requeued by the run's recovery policy).
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import PurePosixPath

from tgnb.backends.base import JobState, JobStatus, RunSpec
from tgnb.backends.slurm.placer import side_job_head
from tgnb.backends.slurm.records import job_status, parse_fields
from tgnb.runs import ft

LIGHTHOUSE_SCRIPT = "lighthouse.sbatch"
#: The lighthouse's job id, written at submit (cancelled with the run).
LIGHTHOUSE_JOB_FILE = ".tgnb-lighthouse"
#: The groups' array job id, written at submit: the lighthouse stops when it has left the queue.
GROUPS_JOB_FILE = ".tgnb-groups"
#: ``HOST:PORT`` of the lighthouse, written by its job once it listens.
ADDRESS_FILE = "lighthouse.addr"
#: A group's log: the array's id and the task's index.
LOG_PATTERN = "slurm-%A_%a.out"
#: How long a group waits for the lighthouse's address before it fails (counted, requeued).
ADDRESS_WAIT_S = 600
#: How often the lighthouse's job looks whether the groups are still queued.
POLL_S = 10


def is_groups(spec: RunSpec) -> bool:
    return spec.train.fault_tolerance == ft.TORCHFT


def group_spec(spec: RunSpec) -> RunSpec:
    """What each group's job runs: the run on one node (its own torchrun rendezvous)."""
    res = dataclasses.replace(spec.resources, nodes=1, min_nodes=None)
    return dataclasses.replace(spec, resources=res)


def group_directives(spec: RunSpec) -> list[str]:
    """The ``#SBATCH`` options a group's job adds: one array task per group."""
    return [f"--array=0-{spec.resources.nodes - 1}"]


def failures_file(name: str) -> str:
    """Each group counts its own failures against the policy's ``max_restarts``."""
    return f"{name}-$SLURM_ARRAY_TASK_ID"


def group_environment(spec: RunSpec) -> list[str]:
    """The script lines that give every process of the group the contract (`tgnb.runs.ft.group_env`):
    its index from the array task, the lighthouse's URL from `ADDRESS_FILE`, waited for."""
    groups = spec.resources.nodes
    lines = [
        f"# Replica group $SLURM_ARRAY_TASK_ID of {groups} (TorchFT, tgnb.backends.slurm.groups):",
        "# the lighthouse's job writes its HOST:PORT on shared storage once it listens.",
    ]
    for name, value in ft.group_env("LIGHTHOUSE", 0, groups).items():
        if name == ft.REPLICA_GROUP_ENV:
            lines.append(f'export {name}="$SLURM_ARRAY_TASK_ID"')
        elif name != ft.LIGHTHOUSE_ENV:
            lines.append(f"export {name}={shlex.quote(value)}")
    address = f'"$TGNB_RUN_DIR/{ADDRESS_FILE}"'
    lines += [
        "waited=0",
        f"until [ -s {address} ]; do",
        f'  if [ "$waited" -ge {ADDRESS_WAIT_S} ]; then',
        f'    echo "tgnb: no lighthouse address in {ADDRESS_FILE} after {ADDRESS_WAIT_S}s: is its'
        ' job running? (squeue; its log: lighthouse-*.out)"',
        "    exit 1",
        "  fi",
        "  sleep 2; waited=$((waited + 2))",
        "done",
        f'export {ft.LIGHTHOUSE_ENV}="http://$(cat {address})"',
        f'echo "tgnb: replica group ${ft.REPLICA_GROUP_ENV} of {groups}, lighthouse'
        f' ${ft.LIGHTHOUSE_ENV}"',
    ]
    return lines


def lighthouse_program(python: str) -> str:
    """``torchft_lighthouse`` beside the nodes' interpreter (its wheel installs both), or on PATH."""
    path = PurePosixPath(python)
    return str(path.parent / "torchft_lighthouse") if path.is_absolute() else "torchft_lighthouse"


def render_lighthouse(
    spec: RunSpec, run_dir: str, python: str, partition: str | None = None
) -> str:
    """The lighthouse's sbatch script. Kept off the preemptible nodes by `partition` (a standard
    partition) or, without one, by the ``--exclude`` the backend adds when it submits it."""
    head = side_job_head(spec, run_dir, "lighthouse", "1G")
    head += [f"--partition={partition}"] if partition else []
    head += [f"--account={spec.account}"] if spec.account else []
    head += [f"--time={spec.time_limit}"] if spec.time_limit else []
    head.append("--export=ALL")
    options = ft.lighthouse_options(spec.env)
    command = ft.lighthouse_command('"0.0.0.0:$PORT"', options, lighthouse_program(python))
    command[0] = shlex.quote(command[0])
    body = [
        f"# The TorchFT lighthouse of run {spec.name} (tgnb.backends.slurm.groups), off the",
        "# preemptible nodes: its replica groups find it by the address it writes below.",
        "set -uo pipefail",
        f"ADDRESS={run_dir}/{ADDRESS_FILE}",
        f"GROUPS_FILE={run_dir}/{GROUPS_JOB_FILE}",
        'rm -f "$ADDRESS"',
        f"PORT=$({shlex.quote(python)} -c 'import socket; s = socket.socket();"
        ' s.bind(("", 0)); print(s.getsockname()[1])\')',
        f"{' '.join(command)} &",
        "child=$!",
        "trap 'kill \"$child\" 2>/dev/null' TERM INT",
        'until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do',
        '  kill -0 "$child" 2>/dev/null || { echo "tgnb: the lighthouse exited"; wait "$child";'
        " exit 1; }",
        "  sleep 0.5",
        "done",
        'echo "$(hostname):$PORT" > "$ADDRESS.tmp$$" && mv "$ADDRESS.tmp$$" "$ADDRESS"',
        'echo "tgnb: lighthouse listening at $(cat "$ADDRESS")"',
        "# Stop once the groups' array has left the queue (finished, failed or cancelled).",
        'while kill -0 "$child" 2>/dev/null; do',
        '  groups=$(cat "$GROUPS_FILE" 2>/dev/null)',
        '  if [ -n "$groups" ]; then',
        '    out=$(squeue -h -j "$groups" -o %i 2>&1); rc=$?',
        '    if { [ "$rc" -eq 0 ] && [ -z "$out" ]; } || [[ "$out" == *"Invalid job id"* ]]; then',
        '      echo "tgnb: the replica groups (job $groups) have ended: stopping the lighthouse"',
        '      kill "$child" 2>/dev/null; break',
        "    fi",
        "  fi",
        f"  sleep {POLL_S} & wait $!",
        "done",
        'wait "$child"',
        'rm -f "$ADDRESS"',
        "exit 0",
    ]
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {d}" for d in head), *body]) + "\n"


def preemptible_nodes(sinfo: str) -> list[str]:
    """The nodes with the ``preemptible`` feature, from ``sinfo -h -N -o '%N|%f'``."""
    out = set()
    for line in sinfo.splitlines():
        name, _, features = line.strip().partition("|")
        if name and "preemptible" in features.split(","):
            out.add(name)
    return sorted(out)


def standard_nodes(sinfo: str) -> list[str]:
    """The nodes without the ``preemptible`` feature, from the same ``sinfo`` output."""
    names = {line.strip().partition("|")[0] for line in sinfo.splitlines() if line.strip()}
    return sorted(names - set(preemptible_nodes(sinfo)))


def array_status(lines: list[str]) -> JobStatus:
    """The run's status from its array's records (``scontrol show job -o ARRAY``: one line per
    task, pending tasks folded into one): running while any group runs; else waiting (requeued
    when a group was preempted) while any is queued; once all have ended, failed if any failed,
    cancelled if any was, else succeeded. Restarts are the groups' together."""
    tasks = [job_status(parse_fields(line)) for line in lines if line.strip()]
    if not tasks:
        return JobStatus(JobState.UNKNOWN)
    states = [t.state for t in tasks]
    restarts = sum(t.restart_count for t in tasks)
    nodes = tuple(sorted({n for t in tasks for n in t.nodes}))
    detail = f"{states.count(JobState.RUNNING)} of {len(tasks)} group job(s) running"
    for state in (JobState.RUNNING, JobState.REQUEUED, JobState.PENDING, JobState.UNKNOWN):
        if state in states:
            return JobStatus(state, restarts, nodes, None, detail)
    for state in (JobState.FAILED, JobState.CANCELLED):
        if state in states:
            worst = next(t for t in tasks if t.state is state)
            return JobStatus(state, restarts, nodes, worst.exit_code, worst.detail)
    return JobStatus(JobState.SUCCEEDED, restarts, nodes, 0, "every group finished")
