"""The domain types of a run: what it asks for (`RunSpec`, `Resources`, `SecretRef`), the states of
its job (`JobState`, `JobStatus`) and the exit code that means "preempted, resume me".

They sit below both the run store (`tgnb.runs`) and the workload backends (`tgnb.backends`), and the
training runtime (`tgnb.train`) reads `EXIT_PREEMPTED` from here: none of them imports another for
these. Nothing here imports an engine's library.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tgnb.errors import ValidationError

#: GPUs on one node of a Together GPU cluster: targets and counts come in whole nodes. Defined here
#: once; the emulator, the control plane, the backends and `Session` read it from here.
GPUS_PER_NODE = 8

#: Exit code of a training process that saved a checkpoint because it was preempted and wants to be
#: started again (BSD EX_TEMPFAIL). 0 means finished, anything else failed.
EXIT_PREEMPTED = 75

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?$")


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    REQUEUED = "requeued"  # preempted; will run again
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    restart_count: int = 0
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class SecretRef:
    """A secret passed by reference only, never by value.

    Kubernetes: ``secretKeyRef`` to `name`/`key`. Slurm and local: the variable `env` is read from
    the submitting environment at launch time and never written into a script or manifest.
    """

    name: str
    key: str = ""
    env: str = ""


@dataclass(frozen=True)
class Resources:
    nodes: int = 1
    min_nodes: int | None = None  # elastic restarts: start when this many nodes are free
    gpus_per_node: int = GPUS_PER_NODE
    preemptible: bool = True
    cpus_per_task: int | None = None
    memory_gib: int | None = None

    def validate(self) -> None:
        if self.nodes < 1:
            raise ValidationError(f"nodes must be at least 1, got {self.nodes}: try nodes=1")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ValidationError(
                f"min_nodes must be between 1 and nodes ({self.nodes}), got {self.min_nodes}"
            )
        if self.gpus_per_node < 0:
            raise ValidationError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")


@dataclass(frozen=True)
class RunSpec:
    """What to run and where. `train` is the training config mapping (``tgnb.train`` YAML)."""

    name: str
    train: Mapping[str, Any]
    resources: Resources = field(default_factory=Resources)
    image: str | None = None  # Kubernetes
    partition: str | None = None  # Slurm
    account: str | None = None  # Slurm
    time_limit: str | None = None  # Slurm, e.g. "04:00:00"
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, SecretRef] = field(default_factory=dict)  # env var name -> reference
    run_dir: str | None = None  # on shared storage; stable across restarts

    def validate(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValidationError(
                f"run name {self.name!r} is not valid: use lowercase letters, digits and '-', "
                "starting and ending with a letter or digit (at most 50 characters)"
            )
        self.resources.validate()
