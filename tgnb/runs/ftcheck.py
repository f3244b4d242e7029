"""The launch-time checks of a run launched as TorchFT replica groups (``fault_tolerance=
"torchft"``, issue 50): what every engine refuses before anything is recorded or submitted,
each in one line naming the fix (`check`), what Slurm and Kubernetes refuse and the local engine
runs (`refuse_moves`), and the check that the interpreter that will run the groups can import
``torchft`` (`torchft_missing`).

What a launch as replica groups is, on every engine: the run's ``nodes`` are its groups, one per
node (a group is a node's processes, DDP or FSDP inside it, under its own torchrun); a lighthouse
(TorchFT's ``torchft_lighthouse``), the run's coordinator, runs on a standard node. The decisions
taken here, and why:

- ``nodes >= 2``: a lone group has no peer to keep training while it is away, nor one to heal
  from when it comes back, so it is refused rather than launched as a slower plain run;
- the built-in ``grpo``/``dpo``/``sft`` runs are refused: they run TRL's trainers, which do not
  use TorchFT's ``Manager``; the run must be the user's own program (a script or a command)
  that uses TorchFT's ``Manager``/``DistributedDataParallel``/``Optimizer``, or tgnb's
  ``Checkpointer(..., fault_tolerant=True)``;
- ``min_nodes`` is refused: it shrinks a run that restarts as a whole, and the groups of a run
  under TorchFT never restart together (the survivors go on at any count from one);
- a recovery policy that moves groups between node classes (``when_short="standard"``, a
  ``deadline``) is run by the local engine alone, which decides each missing group's placement
  by the policy (`tgnb.backends.local.groupplace`: a standard node after ``wait_s``, and back to
  a preemptible one, the group leaving as ``moved`` and its replacement healing); Slurm and
  Kubernetes place the groups as one array or Indexed Job with no placer per group, so they
  refuse it in their preflight (`refuse_moves`), and their groups wait for preemptible capacity
  (``when_short="wait"``, the default).

Whether ``torchft`` is installed is the engine's check, as only the engine knows which
interpreter runs the groups (`torchft_missing`: the local engine's, the Slurm nodes'); on
Kubernetes the image must have it, which tgnb cannot see from here (docs/replica-groups.md).
"""

from __future__ import annotations

import importlib.util

from tgnb.errors import ValidationError
from tgnb.runs import ft
from tgnb.runs.ft import TORCHFT
from tgnb.runs.spec import RunSpec
from tgnb.runs.trainconfig import ALGORITHMS

#: What to install where the groups run (the extra's torchft wheel has the lighthouse too).
INSTALL = "pip install 'tgnb[torchft]'"


def check(spec: RunSpec) -> None:
    """Refuse a run launched as replica groups that no engine can run as such (see the module
    docstring); nothing for a run without ``fault_tolerance``."""
    if spec.train.fault_tolerance != TORCHFT:
        return
    fix = "or drop fault_tolerance"
    if spec.train.algorithm in ALGORITHMS:
        raise ValidationError(
            f"fault_tolerance='torchft' runs your own program as replica groups, and the "
            f"built-in {spec.train.algorithm} run does not use TorchFT: launch a script that uses "
            f"torchft's Manager (or tgnb.train.Checkpointer(..., fault_tolerant=True)), {fix}"
        )
    res = spec.resources
    if res.nodes < 2:
        raise ValidationError(
            "fault_tolerance='torchft' needs nodes=2 or more (one replica group per node: a lone "
            f"group has no peer to train on while it is away or to heal from): nodes=2, {fix}"
        )
    if res.min_nodes is not None:
        raise ValidationError(
            "min_nodes= shrinks a run that restarts as a whole; with fault_tolerance='torchft' "
            "the surviving groups go on without restarting, at any count: drop min_nodes"
        )
    given = sorted(set(spec.env) & {ft.LIGHTHOUSE_ENV, ft.REPLICA_GROUP_ENV, ft.NUM_GROUPS_ENV})
    if given:
        raise ValidationError(
            f"env {given[0]} is set by tgnb for each replica group (tgnb.runs.ft): drop it from env"
        )
    try:
        ft.lighthouse_options(spec.env)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def refuse_moves(spec: RunSpec, engine: str) -> None:
    """For `engine` (Slurm, Kubernetes), whose replica groups have no placer of their own: refuse
    a run as replica groups whose recovery policy moves groups between node classes."""
    if spec.train.fault_tolerance != TORCHFT:
        return
    policy = spec.policy
    if policy.when_short == "standard" or policy.deadline is not None:
        what = "deadline=" if policy.deadline is not None else "when_short='standard'"
        raise ValidationError(
            f"recovery {what} moves replica groups between node classes, which only the local "
            f"engine does; on {engine} each group waits for preemptible capacity: drop {what}"
        )


def torchft_missing(where: str) -> ValidationError:
    """The refusal of a run as replica groups whose interpreter, `where`, lacks ``torchft``."""
    return ValidationError(
        f"fault_tolerance='torchft' needs the torchft package {where}, and it is not "
        f"importable there: {INSTALL} (or launch without fault_tolerance)"
    )


def require_here(spec: RunSpec) -> None:
    """For an engine that runs the groups with this interpreter (the local engine): refuse a run
    as replica groups when ``torchft`` is not importable here."""
    if spec.train.fault_tolerance == TORCHFT and importlib.util.find_spec(TORCHFT) is None:
        raise torchft_missing("in this Python environment")
