"""Renders a run as an sbatch script plus its training config (``config.yaml``), following Together's
preemptible-compute guide for Slurm:

- ``--constraint=preemptible`` for preemptible work, ``--requeue`` so a run whose node is removed
  (or which checkpointed on a drain notice) runs again, ``--open-mode=append`` so the log survives
  requeues, ``--nodes=MIN-MAX`` for elastic restarts;
- a run directory on shared storage named after the run, never a timestamp, so a requeued job finds
  its checkpoints (the training runtime resumes from the newest complete one by itself; the script
  logs the restart from ``SLURM_RESTART_COUNT``);
- ``srun torchrun`` with a c10d rendezvous, or a plain ``srun python -m tgnb.train`` (a command, a
  one-process built-in task), as the one process model says (`tgnb.runs.node.processes`), with the
  GPUs the cluster's nodes have (their GRES, read by the backend: `RenderOptions.node_gpus`);
- the step runs in the background and the script ``wait``s for it, so a SIGTERM reaches the trap at
  once and is forwarded;
- the run's recovery policy (`tgnb.runs.recovery`) is rendered here and nowhere else in the
  script: ``--nodes=MIN-MAX`` when it shrinks; a "resume me" exit (75, checkpointed after a drain
  notice) requeues the job unless Slurm signalled it; a failure is requeued after the policy's
  backoff while the failures counted in the run directory stay within ``max_restarts``. Each
  requeue is a ``RunRequeued`` / ``RunFailedRestarting`` event in the run's ``events.jsonl``. The
  script exports ``TGNB_REQUEUE=script`` (`tgnb.runs.node.REQUEUE_ENV`), so the runtime leaves the
  requeue to it: one place decides (the runtime requeues only under a user's own sbatch script);
  a policy that moves between node classes (``when_short="standard"``, a deadline) gets its
  placer job as well (`tgnb.backends.slurm.placer`), which changes what the job asks for while
  it is pending;
- secrets by reference only: the script checks or maps the variable by name, never its value;
- the run's budget (``budget_usd``, its prices, its GPUs) exported for the node to hold
  (`tgnb.train.budget`): exit 77 at the budget, never requeued.

Rendering is a pure function of the `RunSpec` and options: the golden files pin its output.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tgnb import events as ev
from tgnb.backends.base import RunSpec
from tgnb.backends.slurm import groups as ft_groups
from tgnb.config import MASK_VARS_ENV
from tgnb.errors import ValidationError
from tgnb.runs import node, placing
from tgnb.runs.recovery import FINAL_CODES, RecoveryPolicy

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$|^(UNLIMITED|INFINITE)$")
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:+-]+$")
CONFIG_NAME = node.CONFIG  # a view of the run file, for a person
RUN_FILE_NAME = node.RUN_FILE  # what the node reads (`tgnb.runs.runfile`)
SCRIPT_NAME = "job.sbatch"
LOG_PATTERN = "slurm-%j.out"
#: Failures counted so far (the recovery policy's budget; requeues for preemption are not in it).
FAILURES_FILE = ".tgnb-failures"


@dataclass(frozen=True)
class RenderOptions:
    """Cluster-side choices that are not part of the run: `gres` off for CPU-only clusters,
    the interpreter on the nodes (it runs torchrun as ``python -m tgnb.train.launch``), the
    rendezvous port, and the GPUs the cluster's nodes have (`node_gpus`)."""

    gres: bool = True
    python: str = "python"
    rdzv_port: int = 29500
    #: the most GPUs a node of the cluster has (Slurm's GRES, `gres_gpus`); None: not read
    node_gpus: int | None = None


def _check_name(kind: str, name: str) -> None:
    if not _ENV_NAME.fullmatch(name):
        raise ValidationError(f"{kind} name {name!r} is not a valid environment variable name")


def _check_word(kind: str, value: str) -> None:
    if not _SLURM_WORD.fullmatch(value):
        raise ValidationError(f"Slurm {kind} {value!r} has characters sbatch does not accept")


_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


def gres_gpus(sinfo_g: str) -> int:
    """The most GPUs a node has, from ``sinfo -h -o %G`` (one GRES list a line: ``(null)``,
    ``gpu:8``, ``gpu:h100:8(S:0-1),mps:100``); 0 when no node has one."""
    counts = [int(m.group(1)) for line in sinfo_g.split() for m in _GRES_GPU.finditer(line)]
    return max(counts, default=0)


def run_gpus(spec: RunSpec, options: RenderOptions) -> int:
    """The GPUs the run has on each node: what it asks for, within what the nodes have."""
    asked = spec.resources.gpus_per_node
    return asked if options.node_gpus is None else min(asked, options.node_gpus)


def processes(spec: RunSpec, options: RenderOptions) -> node.Processes:
    """What each node starts: the one process model (`tgnb.runs.node.processes`)."""
    return node.processes(spec.train, spec.resources.nodes, run_gpus(spec, options))


def render_config(spec: RunSpec) -> str:
    """The run's training config as YAML (``config.yaml``, a view of the run file: what
    ``tgnb train config.yaml`` reads)."""
    return node.render_config(spec.train.compact())


def directives(spec: RunSpec, run_dir: str, options: RenderOptions) -> list[str]:
    """The ``#SBATCH`` options of the run, in a stable order."""
    res = spec.resources
    out = [
        f"--job-name={spec.name}",
        f"--output={run_dir}/{LOG_PATTERN}",
        "--open-mode=append",
        f"--chdir={run_dir}",
        "--requeue",
    ]
    if spec.policy.when_short == "shrink" and res.min_nodes is not None:
        out.append(f"--nodes={res.min_nodes}-{res.nodes}")  # Slurm starts on what is free
    else:
        out.append(f"--nodes={res.nodes}")
    out.append("--ntasks-per-node=1")
    if res.cpus_per_task is not None:
        out.append(f"--cpus-per-task={res.cpus_per_task}")
    if res.memory_gib is not None:
        out.append(f"--mem={res.memory_gib}G")
    gpus = run_gpus(spec, options)
    if options.gres and gpus > 0:
        out.append(f"--gres=gpu:{gpus}")
    if res.preemptible:
        out.append("--constraint=preemptible")
    if spec.partition:
        _check_word("partition", spec.partition)
        out.append(f"--partition={spec.partition}")
    if spec.account:
        _check_word("account", spec.account)
        out.append(f"--account={spec.account}")
    if spec.time_limit:
        if not _TIME.fullmatch(spec.time_limit):
            raise ValidationError(
                f"time limit {spec.time_limit!r} is not a Slurm time: use e.g. 04:00:00 or 1-00:00:00"
            )
        out.append(f"--time={spec.time_limit}")
    out.append("--export=ALL")
    return out


def _launch(spec: RunSpec, options: RenderOptions) -> list[str]:
    """`tgnb.runs.node.command` as script lines: its words are shell words here (the config and
    run directory are the script's variables)."""
    model = processes(spec, options)
    python, config, run_dir = shlex.quote(options.python), '"$TGNB_CONFIG"', '"$TGNB_RUN_DIR"'
    if not model.torchrun:  # one process on each node: a command, or a one-process task
        argv = node.command(python, config, run_dir)
        return [f"srun --kill-on-bad-exit=1 {' '.join(argv)} &"]
    if spec.resources.nodes == 1:  # a rendezvous of its own on a free port: no port to share
        argv = node.command(python, config, run_dir, node.standalone(model.nproc))
        return [f"srun --kill-on-bad-exit=1 {' '.join(argv)} &"]
    torchrun = [
        '--nnodes="$SLURM_JOB_NUM_NODES"',
        f"--nproc_per_node={model.nproc}",
        '--rdzv_id="$SLURM_JOB_ID"',
        "--rdzv_backend=c10d",
        f'--rdzv_endpoint="$MASTER_ADDR:{options.rdzv_port}"',
    ]
    argv = node.command(python, config, run_dir, torchrun)
    head, tail = argv[:3], argv[3 + len(torchrun) :]
    return [
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        # torchrun through tgnb's launcher: the same options, and a worker's exit 75 stays 75
        f"srun --kill-on-bad-exit=1 {' '.join(head)} \\",
        *(f"  {word} \\" for word in torchrun),
        f"  {' '.join(tail)} &",
    ]


def _environment(spec: RunSpec) -> list[str]:
    # a budget the node holds is in the run file (tgnb.train.budget), not in the script
    lines = [f"export {node.GPUS_ENV}={int(spec.resources.gpus_per_node)}  # the node's meter"]
    for name in sorted(spec.env):
        _check_name("environment variable", name)
        lines.append(f"export {name}={shlex.quote(str(spec.env[name]))}")
    if spec.secrets:  # their names, for the node to mask their values in what it writes
        lines.append(f"export {MASK_VARS_ENV}={','.join(sorted(spec.secrets))}")
    for name in sorted(spec.secrets):
        _check_name("secret", name)
        source = spec.secrets[name].env or name
        _check_name("secret source", source)
        msg = f"tgnb: secret {source} is not set in the submitting environment"
        if source == name:
            lines.append(f': "${{{name}:?{msg}}}"')
        else:
            lines.append(f'export {name}="${{{source}:?{msg}}}"')
    return lines


def _recovery(spec: RunSpec) -> list[str]:
    """The policy's "resume me" codes (`RecoveryPolicy.resume_codes`) as a shell test."""
    codes = "|".join(str(c) for c in spec.policy.resume_codes)
    return [
        f"# The recovery policy (tgnb.runs.recovery): exit {codes} means checkpointed, resume me.",
        "# Requeue it here unless Slurm signalled the job (it requeues what it preempts, and a",
        "# cancelled job must stay cancelled). Preemptions never count against the restart budget.",
        f'case "$rc" in {codes}) resume=1 ;; *) resume=0 ;; esac',
    ]


def _record() -> list[str]:
    """A shell function appending one event to the run's ``events.jsonl`` in the runtime's format
    (`tgnb.events.Event.to_dict`, source ``tgnb``): ``record REASON MESSAGE 'MORE-DATA-FIELDS, '``.
    Its words are the script's own (exit codes, counts, the job id): nothing to escape."""
    fmt = (
        '{"data": {%s"exit_code": %s, "job_id": "%s"}, "message": "%s", "node": "%s",'
        ' "reason": "%s", "run": "%s", "source": "tgnb", "time": "%s"}\\n'
    )
    return [
        "record() {",
        f"  printf '{fmt}' \\",
        '    "$3" "$rc" "$SLURM_JOB_ID" "$2" "${SLURMD_NODENAME:-}" "$1" "$TGNB_RUN" \\',
        '    "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)" >> "$TGNB_RUN_DIR/events.jsonl"',
        "}",
    ]


def _backoff(policy: RecoveryPolicy) -> str:
    """The policy's delay for the count in ``$failures``, as the shell takes it: tgnb's table
    (`tgnb.runs.placing.backoff_table`) rendered, not the doubling rewritten in bash."""
    table = [placing.seconds(x) for x in placing.backoff_table(policy)]
    arms = [f"{n}) delay={d} ;;" for n, d in enumerate(table[:-1], start=1)]
    return f'case "$failures" in {" ".join([*arms, f"*) delay={table[-1]} ;;"])} esac'


def _failure_requeue(spec: RunSpec, counted: str = FAILURES_FILE) -> list[str]:
    """A failure is requeued after the policy's backoff while the failures counted in the run
    directory (in `counted`) stay within `max_restarts`; the final codes (bad config, disk full)
    never are."""
    policy = spec.policy
    if policy.max_restarts == 0:
        return ["# max_restarts=0: a failure is final."]
    final = "|".join(str(c) for c in sorted(FINAL_CODES - set(policy.resume_codes)))
    return [
        "",
        "# A failure counts: requeued after the policy's backoff (tgnb.runs.placing.backoff_table)",
        f"# while at most {policy.max_restarts} failures are counted in $TGNB_RUN_DIR/{counted}.",
        'if [ "$rc" -ne 0 ] && [ "$resume" -eq 0 ] && [ "$signalled" -eq 0 ]; then',
        f'  case "$rc" in {final}) final=1 ;; *) final=0 ;; esac',
        f'  failures=$(cat "$TGNB_RUN_DIR/{counted}" 2>/dev/null || echo 0)',
        f'  if [ "$final" -eq 0 ] && [ "$failures" -lt {policy.max_restarts} ]; then',
        "    failures=$((failures + 1))",
        f'    echo "$failures" > "$TGNB_RUN_DIR/{counted}"',
        f"    {_backoff(policy)}",
        f'    echo "tgnb: exit $rc, failure $failures of {policy.max_restarts}: requeue in ${{delay}}s"',
        '    sleep "$delay"',
        f'    record {ev.RUN_FAILED_RESTARTING} "exit $rc, failure $failures of {policy.max_restarts}:'
        ' requeued after ${delay}s" "\\"failures\\": $failures, \\"backoff_s\\": $delay, "',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        "  fi",
        "fi",
    ]


def render_script(spec: RunSpec, run_dir: str, options: RenderOptions | None = None) -> str:
    """The sbatch script of `spec`, whose run directory (checkpoints, logs, config) is `run_dir`.
    A run as TorchFT replica groups is one array task per group, each a one-node run
    (`tgnb.backends.slurm.groups`)."""
    options = options or RenderOptions()
    groups = ft_groups.is_groups(spec)
    run = spec
    if groups:
        spec = ft_groups.group_spec(run)
    if (
        not run_dir.startswith("/")
        or not run_dir.isprintable()
        or any(c in run_dir for c in " \t\n'\"$`\\")
    ):
        raise ValidationError(f"run directory {run_dir!r} must be an absolute path without spaces")
    sbatch = directives(spec, run_dir, options)
    if groups:  # one array task per group, each with its own log
        sbatch[1] = f"--output={run_dir}/{ft_groups.LOG_PATTERN}"
        sbatch[5:5] = ft_groups.group_directives(run)
    head = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in sbatch]
    body = [
        f"# Rendered by tgnb for run {spec.name}. Secrets are passed by name, never by value.",
        "set -uo pipefail",
        "",
        f"export TGNB_RUN={spec.name}",
        f"export TGNB_RUN_DIR={run_dir}",
        f'export TGNB_CONFIG="$TGNB_RUN_DIR/{RUN_FILE_NAME}"',
        f"export {node.REQUEUE_ENV}=script  # this script requeues; the runtime does not",
        *_environment(spec),
        *(ft_groups.group_environment(run) if groups else []),
        'mkdir -p "$TGNB_RUN_DIR"',
        "",
        "# A requeued job (node removed, preempted, or drained) sees SLURM_RESTART_COUNT > 0; the",
        "# training runtime resumes from the newest complete checkpoint in the run directory.",
        "RESTARTS=${SLURM_RESTART_COUNT:-0}",
        'if [ "$RESTARTS" -gt 0 ]; then',
        '  echo "tgnb: job $SLURM_JOB_ID requeued (restart $RESTARTS), resuming from the latest'
        ' checkpoint in $TGNB_RUN_DIR"',
        "fi",
        "",
        "# Run the step in the background and wait for it, so a signal reaches this trap at once.",
        "child=0",
        "signalled=0",
        'forward() { signalled=1; echo "tgnb: $1 received, forwarding to the training step";'
        ' [ "$child" -gt 0 ] && kill -s "$1" "$child" 2>/dev/null; }',
        "trap 'forward TERM' TERM",
        "trap 'forward INT' INT",
        "trap 'forward USR1' USR1",
        *_record(),
        *_launch(spec, options),
        "child=$!",
        'wait "$child"',
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; done',
        'wait "$child"',
        "rc=$?",
        "",
        *_recovery(spec),
        'if [ "$resume" -eq 1 ] && [ "$signalled" -eq 0 ]; then',
        '  echo "tgnb: checkpointed (exit $rc), requeueing job $SLURM_JOB_ID"',
        f'  record {ev.RUN_REQUEUED} "scontrol requeue $SLURM_JOB_ID (exit $rc)" ""',
        '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
        f'  record {ev.RUN_REQUEUED} "scontrol requeue $SLURM_JOB_ID failed" ""',
        "fi",
        *_failure_requeue(
            spec, ft_groups.failures_file(FAILURES_FILE) if groups else FAILURES_FILE
        ),
        'exit "$rc"',
    ]
    return "\n".join(head + body) + "\n"
