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
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tgnb.errors import ValidationError
from tgnb.prices import Prices, check_budget
from tgnb.runs.node import Exit
from tgnb.runs.recovery import RecoveryPolicy, policy_for
from tgnb.runs.trainconfig import TrainConfig, from_dict

if TYPE_CHECKING:
    from tgnb.runs.workdir import Snapshot

#: The version of a run's contract as plain data (`RunSpec.to_dict`): the store's records and the
#: run file (`tgnb.runs.runfile`) carry it as ``schema``. A record without it was written before
#: the field (version 0, read the same way); a newer one is refused, naming the fix.
SCHEMA = 1

#: GPUs on one node of a Together GPU cluster: targets and counts come in whole nodes. Defined here
#: once; the emulator, the control plane, the backends and `Session` read it from here.
GPUS_PER_NODE = 8

#: Exit code of a training process that saved a checkpoint because it was preempted and wants to be
#: started again (`tgnb.runs.node.Exit`, the one list of exit codes). 0 means finished.
EXIT_PREEMPTED = int(Exit.PREEMPTED)

_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?")  # fullmatch: no trailing newline
#: Upper bounds of what one run may ask for (a script or manifest never holds more).
MAX_NODES, MAX_GPUS_PER_NODE, MAX_CPUS_PER_TASK, MAX_MEMORY_GIB = 1024, 16, 4096, 65536


def _count(name: str, value: object, low: int, high: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value < low:
        raise ValidationError(f"{name} must be at least {low}, got {value}: try {name}={low}")
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(
            f"{name} must be an integer from {low} to {high}, got {value!r:.60}: e.g. {name}={low}"
        )


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

    def __str__(self) -> str:
        """A sentence: ``succeeded after 1 restart, on gpu-preemptible-dp-2, exit 0``."""
        restarts = self.restart_count
        parts = [self.state.value]
        if restarts:
            parts[0] += f" after {restarts} restart{'s' if restarts != 1 else ''}"
        if self.nodes:
            parts.append(f"on {', '.join(self.nodes)}")
        if self.exit_code is not None:
            parts.append(f"exit {self.exit_code}")
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """What a notebook cell shows for a status (``run.wait()``): the sentence, not the repr."""
        p.text(f"run {self}")


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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field typed and bounded: each one reaches a script or a manifest."""
        _count("nodes", self.nodes, 1, MAX_NODES)
        _count("min_nodes", self.min_nodes, 1, MAX_NODES, optional=True)
        _count("gpus_per_node", self.gpus_per_node, 0, MAX_GPUS_PER_NODE)
        _count("cpus_per_task", self.cpus_per_task, 1, MAX_CPUS_PER_TASK, optional=True)
        _count("memory_gib", self.memory_gib, 1, MAX_MEMORY_GIB, optional=True)
        if not isinstance(self.preemptible, bool):
            raise ValidationError(
                f"preemptible must be True or False, got {self.preemptible!r:.60}"
            )
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ValidationError(
                f"min_nodes must be between 1 and nodes ({self.nodes}), got {self.min_nodes}"
            )
        if self.gpus_per_node < 0:
            raise ValidationError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")


def pop_schema(d: dict[str, Any], what: str, where: str) -> int:
    """Take ``schema`` out of `d` (0 when absent: written before the field) and return it; a
    `ValidationError` naming the fix when it is not a version this tgnb reads."""
    schema = d.pop("schema", 0)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema > SCHEMA:
        raise ValidationError(
            f"{what} schema {schema!r:.20} is newer than this tgnb reads ({SCHEMA}): "
            f"upgrade tgnb (pip install -U tgnb) {where}"
        )
    return schema


@dataclass(frozen=True)
class RunSpec:
    """What to run and where: the run's contract, validated once, when it is built (a bad value
    is a `ValidationError` naming the fix); the engines and the store take it as it is. `train` is
    the run's `TrainConfig`; a mapping given instead is read with `tgnb.runs.trainconfig.from_dict`
    (an unknown key is a `TrainConfigError`), its ``name`` the run's when it gives none (as the
    node named it from its run directory). `snapshot` is the workdir as the launch took and checked it
    (`tgnb.prelaunch.plan`), which the engines ship (never stored)."""

    name: str
    train: TrainConfig
    resources: Resources = field(default_factory=Resources)
    image: str | None = None  # Kubernetes
    partition: str | None = None  # Slurm
    account: str | None = None  # Slurm
    time_limit: str | None = None  # Slurm, e.g. "04:00:00"
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, SecretRef] = field(default_factory=dict)  # env var name -> reference
    run_dir: str | None = None  # on shared storage; stable across restarts
    #: the folder snapshotted at submit into run_dir/workdir (`tgnb.runs.node.WORKDIR`)
    workdir: str | None = None
    #: how the run recovers (`tgnb.runs.recovery`); None: the default (`policy`)
    recovery: RecoveryPolicy | None = None
    snapshot: Snapshot | None = field(default=None, compare=False, repr=False)
    #: stop the run (it checkpoints) once its GPU-hours cost this many dollars at `prices`
    budget_usd: float | None = None
    #: USD per GPU-hour of each node class, as the launch resolved them (`tgnb.prices`)
    prices: Prices | None = None

    def __post_init__(self) -> None:
        if isinstance(self.train, Mapping):  # RunSpec(name=..., train={...}): read once, here
            train = from_dict({"name": self.name, **self.train})
            object.__setattr__(self, "train", train)
        self.validate()

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON-able data, with its ``schema`` (secrets stay references; the
        launch's `snapshot` is shipped by the engine, never written)."""
        out = asdict(self)
        out.pop("snapshot", None)
        out["train"] = self.train.to_dict()
        out["env"] = dict(self.env)
        out["secrets"] = {k: asdict(v) for k, v in self.secrets.items()}
        out["recovery"] = None if self.recovery is None else self.recovery.to_dict()
        return {"schema": SCHEMA, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSpec:
        """The spec `to_dict` wrote, of this version or an older one (a record without
        ``schema``, its ``train`` in few keys, reads the same); validated as a new one is."""
        d = dict(data)
        pop_schema(d, "run record", "where this record is read")
        d["resources"] = Resources(**dict(d.get("resources") or {}))
        d["secrets"] = {k: SecretRef(**dict(v)) for k, v in dict(d.get("secrets") or {}).items()}
        d["train"] = dict(d.get("train") or {})  # read by __post_init__ (`from_dict`)
        d["env"] = dict(d.get("env") or {})
        if d.get("recovery") is not None:
            d["recovery"] = RecoveryPolicy.from_dict(d["recovery"])
        if d.get("prices") is not None:
            d["prices"] = Prices(**dict(d["prices"]))
        return cls(**d)

    def workdir_snapshot(self) -> Snapshot | None:
        """The snapshot the engines ship: the launch's, or (a spec built by hand) one taken now."""
        from tgnb.runs import workdir

        if self.snapshot is not None or self.workdir is None:
            return self.snapshot
        return workdir.scan(self.workdir)

    @property
    def policy(self) -> RecoveryPolicy:
        """The recovery policy the engines render (`tgnb.runs.recovery.policy_for`)."""
        res = self.resources
        return policy_for(self.recovery, res.min_nodes, res.nodes)

    def validate(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ValidationError(
                f"run name {self.name!r:.60} is not valid: use lowercase letters, digits and '-', "
                "starting and ending with a letter or digit (at most 50 characters)"
            )
        if not isinstance(self.train, TrainConfig):
            raise ValidationError(
                f"train must be a TrainConfig or a mapping, got {type(self.train).__name__}: "
                "e.g. train={'algorithm': 'grpo'}"
            )
        if not isinstance(self.resources, Resources):  # a Resources checked itself when built
            raise ValidationError(
                f"resources must be a Resources, got {type(self.resources).__name__}: "
                "e.g. resources=Resources(nodes=1)"
            )
        if self.recovery is not None and not isinstance(self.recovery, RecoveryPolicy):
            raise ValidationError(
                f"recovery must be a RecoveryPolicy, got {type(self.recovery).__name__}: "
                "e.g. recovery=RecoveryPolicy(when_short='shrink')"
            )
        check_budget(self.budget_usd)
        if self.prices is not None and not isinstance(self.prices, Prices):
            raise ValidationError(
                f"prices must be a tgnb.prices.Prices, got {type(self.prices).__name__}"
            )
        if self.budget_usd is not None and self.prices is None:
            raise ValidationError(
                "budget_usd needs the prices per GPU-hour, and this cluster's GPU type has none: "
                "%config Tg.standard_price = 2.5 and Tg.preemptible_price = 1.2 (or prices=)"
            )
        res = self.resources
        if self.budget_usd is not None and self.prices is not None:
            classes = ["preemptible"] if res.preemptible else ["standard"]
            if res.preemptible and (self.policy.when_short == "standard" or self.policy.deadline):
                classes.append("standard")  # it may be moved to standard nodes
            if free := [c for c in classes if not self.prices.of(c) > 0]:
                raise ValidationError(
                    f"budget_usd needs a price above $0 per GPU-hour, and the {free[0]} price is "
                    f"{self.prices.of(free[0])} (from {self.prices.source}): the budget could "
                    f"never be reached; set it, e.g. %config Tg.{free[0]}_price = 2.5 (or prices=)"
                )
        self.policy.validate(res.nodes, res.min_nodes, res.preemptible)
        check_env(self.env)
        check_no_secrets(self)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(env: Mapping[str, str]) -> None:
    """Every variable can apply on every engine and every start: a valid name that tgnb does not
    set itself, and a string value (`check_no_secrets` refuses control characters)."""
    from tgnb.runs.node import RESERVED_ENV

    if not isinstance(env, Mapping):
        raise ValidationError("env must map variable names to string values")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ValidationError(
                f"env name {name!r:.40} is not valid as an environment variable name: use "
                "letters, digits and '_', not starting with a digit"
            )
        if name in RESERVED_ENV:
            raise ValidationError(
                f"env {name} is set by tgnb on the node (the node contract): drop it from env"
            )
        if not isinstance(value, str):
            raise ValidationError(
                f"env {name} must be a string, got {value!r:.40}: e.g. env={{{name!r}: '1'}}"
            )


def check_no_secrets(spec: RunSpec) -> None:
    """Refuse a secret in env or in the training config, for every engine alike: a variable whose
    name looks like a secret's (`tgnb.config.looks_secret`: ``WANDB_API_KEY``, ``HF_TOKEN``...), a
    known secret value, its prefix or a piece of its random part (the API key, the emulator key,
    an HF token: `tgnb.config.holds_secret`), and control characters in a value (a NUL cannot be
    in an environment, a newline breaks a script): all would be written into a script, a
    manifest, config.yaml or the store. A training config key that names a secret
    (`tgnb.config.secret_keys`: ``trl.hub_token``, ``*_key``, ``*password*``) is refused by its
    name, whatever its value, as an env variable is."""
    from tgnb.config import holds_secret, looks_secret, register_env_secrets, secret_keys

    register_env_secrets()
    for name, value in spec.env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValidationError(f"env {name!r:.40} must map a name to a string value")
        if looks_secret(name) or holds_secret(value):
            why = "its name says so" if looks_secret(name) else "its value holds one"
            raise ValidationError(
                f"env {name:.60} looks like a secret: pass it as secrets={{{name!r:.60}: "
                f"SecretRef(name=..., env=...)}}, never by value in env ({why})"
            )
        if bad := [c for c in value if ord(c) < 32 or 127 <= ord(c) < 160]:
            raise ValidationError(
                f"env {name:.60} holds a control character ({ord(bad[0]):#04x}): environment "
                "values must be printable text"
            )
    train = spec.train.to_dict()
    if named := secret_keys(train):
        raise ValidationError(
            f"the training config key {named[0]:.80} names a secret: drop it and pass the secret "
            "by reference, secrets={'HF_TOKEN': SecretRef(name='hf', env='HF_TOKEN')} (the "
            "libraries read HF_TOKEN, WANDB_API_KEY... from the environment)"
        )
    if holds_secret(train):
        raise ValidationError(
            "the training config holds a secret value (e.g. trl.hub_token): drop it and pass the "
            "secret by reference, secrets={'HF_TOKEN': SecretRef(name='hf', env='HF_TOKEN')}"
        )
