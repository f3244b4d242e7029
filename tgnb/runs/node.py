"""The node contract: what every engine puts on a node, and what the runtime there reads.

Written once here; the local supervisor renders it into a Popen (or a warm fork), Slurm into an
sbatch script, Kubernetes into an Indexed Job. Nothing here imports an engine's library or torch.

The run directory (on shared storage, named after the run, stable across restarts)::

    run.json        the run file: the run's contract as the launch validated it, typed
                    (`tgnb.runs.runfile`; Kubernetes mounts it from the run's ConfigMap)
    config.yaml     a view of it: the run's training config in few keys (`render_config`)
    workdir/        the snapshot of the user's workdir taken at launch (script runs; `tgnb.runs.workdir`)
    run.yaml        the resolved config, written by rank 0 at each start
    checkpoints/    checkpoint-<step>/ (DCP shards, a manifest, a marker written last); quarantine/
    metrics.jsonl   one row per logged step
    events.jsonl    RunStarted, RunResumed, SignalReceived, CheckpointSaved, RunExited, ...
    train.log       the program's output (local backend; Slurm: slurm-<job>.out)

The command a node runs is `command`: ``python -m tgnb.train run.json --run-dir DIR``, or the same
under torchrun through ``python -m tgnb.train.launch`` (torchrun's options, and a worker's exit 75
stays 75); which one, and how many processes, is `processes`, the one process model. The runtime
there sets `RUN_DIR_ENV`, `RUN_ENV`, `RUN_FILE_ENV` (the run file, where the checkpoint policy is
read) and `CHECKPOINT_ENV` (a view of that policy) for the user's code, so `tgnb.train.protect`
and `tgnb.train.Checkpointer` find the run and its policy without an argument.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tgnb.config import MASK_VARS_ENV

if TYPE_CHECKING:
    from tgnb.runs.trainconfig import TrainConfig


class Exit(enum.IntEnum):
    """The exit codes of a node's training process, the same on every engine."""

    DONE = 0
    FAILED = 1
    BAD_CONFIG = 2  # refused before anything was trained; one line on stderr says why
    NO_SPACE = 74  # the disk is full; the last complete checkpoint is intact (BSD EX_IOERR)
    PREEMPTED = 75  # checkpointed on a preemption notice: start me again (BSD EX_TEMPFAIL)
    #: stopped by tgnb's launcher at the run's ``budget_usd``, checkpointed: final, never
    #: restarted (`tgnb.train.budget`; BSD EX_NOPERM: not permitted to go on)
    STOPPED = 77
    #: a failure a restart would repeat, the same way: a module not installed, CUDA absent
    #: (`tgnb.runs.outcome.repeats`): final at its first attempt, with its line (BSD EX_CONFIG:
    #: the node lacks what the program needs)
    REPEATS = 78

    @property
    def resume(self) -> bool:
        """Whether the engine should start the run again (from its newest checkpoint)."""
        return self is Exit.PREEMPTED


# -- the run directory -----------------------------------------------------------------------------
RUN_FILE = "run.json"
CONFIG = "config.yaml"
RESOLVED = "run.yaml"
WORKDIR = "workdir"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"
LOG = "train.log"

# -- the environment the runtime gives the user's code ---------------------------------------------
RUN_DIR_ENV = "TGNB_RUN_DIR"
RUN_ENV = "TGNB_RUN"
#: The path of the run file (`RUN_FILE`) the node's runtime runs unchanged, for the user's code:
#: `tgnb.train.protect` and `tgnb.train.Checkpointer` read the checkpoint policy from it. Set by
#: the runtime for a script or command (`tgnb.train.program.environment`); the Slurm script
#: exports it too (the runtime's argument). A value that names no run file (a job rendered
#: before the run file pointed it at ``config.yaml``) is not read.
RUN_FILE_ENV = "TGNB_CONFIG"
#: A view of the run file's checkpoint policy (`CheckpointPolicy` as JSON), set by the runtime
#: beside `RUN_FILE_ENV`: for user programs that read it, and read by `tgnb.train.protect` where
#: no run file is named (the runtime was started on a ``config.yaml``, by a job rendered before).
CHECKPOINT_ENV = "TGNB_CHECKPOINT"
RESTART_ENV = "TGNB_RESTART_COUNT"
NODE_ENV = "TGNB_NODE"
#: Set to ``script`` by a job script that tgnb rendered (the sbatch script): the script requeues
#: the job on the recovery policy's "resume me" codes, so the runtime does not. Unset (a user's own
#: sbatch script around `tgnb.train.protect`), the runtime requeues its job after a drain notice.
REQUEUE_ENV = "TGNB_REQUEUE"
#: The variables an engine counts a run's restarts in: tgnb's own (local engine, Kubernetes), Slurm's.
RESTART_VARS = (RESTART_ENV, "SLURM_RESTART_COUNT")


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """This start's restart count as the engine set it (0: the first start, or no engine)."""
    env = os.environ if env is None else env
    counts = [int(v) for v in (env.get(n, "").strip() for n in RESTART_VARS) if v.isdigit()]
    return max(counts, default=0)


def last_step(run_dir: str | os.PathLike[str]) -> int:
    """The newest step in the run's `METRICS` (0 when none yet): the run's progress, read by
    the engines that place a restart (a deadline judges by it)."""
    try:
        with open(Path(run_dir) / METRICS, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            return int(json.loads(line).get("step") or 0)
    return 0


NOTICE_ENV = "TGNB_NOTICE_FILE"
#: The run's budget as JSON (`tgnb.runs.budget.Budget`), for the node's process to hold it
#: (`tgnb.train.budget`), in a Slurm or Kubernetes job rendered before the run file, which holds
#: the budget now (`tgnb.runs.runfile.RunFile.budget`); still read there, never set.
BUDGET_ENV = "TGNB_BUDGET"
#: The GPUs the run holds on each node, for the node's own meter (`tgnb.train.budget.held`,
#: `tgnb.runs.meter`): set by Slurm and Kubernetes.
GPUS_ENV = "TGNB_NODE_GPUS"
#: Set (to who meters) where the node must not meter itself: the local engine's supervisor meters
#: from outside, and a node's top tgnb process sets it for the processes it starts.
METERED_ENV = "TGNB_METERED"
#: Set by a node's top tgnb process once it printed its attempt's marker (`tgnb.runs.livelog`):
#: the processes it starts print none.
ATTEMPT_MARKED_ENV = "TGNB_ATTEMPT_MARKED"
#: Set by the engines and the runtime: a run's ``env`` may not set them (refused at launch).
RESERVED_ENV = frozenset(
    {RUN_DIR_ENV, RUN_ENV, RUN_FILE_ENV, CHECKPOINT_ENV, RESTART_ENV, NODE_ENV, NOTICE_ENV}
    | {BUDGET_ENV}
    | {GPUS_ENV, METERED_ENV, MASK_VARS_ENV, ATTEMPT_MARKED_ENV}
    | {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    | {"SLURM_RESTART_COUNT", "SLURM_JOB_ID", "PYTHONUNBUFFERED"}
)
#: Read by the interpreter or native libraries when a process starts: a warm (forked) start cannot
#: apply them, so a run that sets one is started cold (see `tgnb.backends.local.warm`).
STARTUP_ENV_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "MALLOC_", "CUDA_", "NCCL_")


def needs_cold_start(env: Mapping[str, str]) -> bool:
    """Whether `env` sets a variable only a fresh interpreter applies."""
    return any(name.startswith(STARTUP_ENV_PREFIXES) for name in env)


def runtime_args(config: str, run_dir: str) -> list[str]:
    """The runtime's own arguments: ``-m tgnb.train CONFIG --run-dir RUN_DIR``."""
    return ["-m", "tgnb.train", config, "--run-dir", run_dir]


# -- the process model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Processes:
    """How each node of a run starts its program (`processes`): `nproc` training processes under
    torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set), or one process of its own."""

    nproc: int
    torchrun: bool


def processes(train: TrainConfig, nodes: int, gpus: int) -> Processes:
    """The one process model, for every engine (docs/process-model.md): what each of the run's
    `nodes` nodes starts, where the run has `gpus` GPUs on each node -- as the cluster's nodes
    have them (the API's or the emulator's node records, Slurm's GRES), never a constant.

    - a ``command`` runs once per node and never under torchrun: it is its own launcher;
    - a ``script`` (plain, with ``protect`` or the ``Checkpointer``) runs under torchrun with one
      process per GPU (one on a node without a GPU), at any node count: 1, several, after a
      shrink to one;
    - a built-in task runs under torchrun when the run has more than one process, alone
      otherwise (a local engine may then fork it warm).
    """
    nproc = max(1, gpus)
    if train.command is not None:
        return Processes(nproc=1, torchrun=False)
    if train.algorithm == "script" or train.script is not None:
        return Processes(nproc=nproc, torchrun=True)
    return Processes(nproc=nproc, torchrun=nodes > 1 or nproc > 1)


def node_rank(env: Mapping[str, str] | None = None) -> int:
    """This node's index in its run as the engine set it (Slurm's ``SLURM_NODEID``, an Indexed
    Job's ``JOB_COMPLETION_INDEX``; 0 alone): node 0 records the run's node-wide events."""
    env = os.environ if env is None else env
    for name in ("SLURM_NODEID", "JOB_COMPLETION_INDEX"):
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return 0


def standalone(nproc: int) -> list[str]:
    """torchrun's options for a one-node run: its own rendezvous on a free port."""
    return ["--standalone", "--nnodes=1", f"--nproc_per_node={nproc}"]


def command(
    python: str, config: str, run_dir: str, torchrun: Sequence[str] | None = None
) -> list[str]:
    """The command a node runs: the runtime alone, or under torchrun with `torchrun`'s options
    (``--nnodes``, ``--nproc_per_node``, the rendezvous: each engine gives its own, as
    `processes` decided)."""
    if torchrun is None:
        return [python, *runtime_args(config, run_dir)]
    return [python, "-m", "tgnb.train.launch", *torchrun, *runtime_args(config, run_dir)]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


#: A float as tgnb's YAML reader takes it (`tgnb.tasks.config.load_yaml`): PyYAML's, plus ``1e-3``
#: without a dot (a float in YAML 1.2, a string to plain PyYAML).
YAML_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.inf|\.Inf|\.INF|\.nan|\.NaN|\.NAN)$"
)


class _Dumper(yaml.SafeDumper):
    """Quotes a string tgnb's reader would take as a float: a script's ``"1e-4"`` argument reads
    back as the string given (written bare, it reached ``sys.argv`` as 0.0001)."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    """`data` as YAML that tgnb's reader reads back unchanged (strings stay strings)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def render_config(train: Mapping[str, Any]) -> str:
    """The node's config file (`CONFIG`): the run's training config as plain YAML
    (`tgnb.runs.trainconfig.TrainConfig.compact`). The run directory is not in it: the command
    line gives it (``--run-dir``)."""
    body = {k: v for k, v in _plain(train).items() if k != "run_dir"}
    return dump_yaml(body)
