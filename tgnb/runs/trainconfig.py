"""The training config of a run (`TrainConfig`): part of the run's contract (`tgnb.runs.spec.RunSpec`
holds one), so it lives below every plane that reads it. Frozen and typed; `from_dict` is the one
reading of it from plain data (a launch's mapping, the node's ``config.yaml``, a stored record),
where an unknown key is a `TrainConfigError` naming the close matches.

The checks that need the workdir, a model or the rewards are `tgnb.tasks.config`'s (``check_light``);
those that need TRL are `tgnb.train.validate`'s, on the node.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.atomic import atomic_write
from tgnb.config import default_home
from tgnb.errors import TrainConfigError
from tgnb.runs.node import dump_yaml
from tgnb.runs.policy import CheckpointPolicy

ALGORITHMS = ("grpo", "dpo", "sft")
#: The kind of a run of the user's own program (a script or a command).
SCRIPT = "script"
KINDS = (*ALGORITHMS, SCRIPT)
DEFAULT_DATASET = {"grpo": "arithmetic", "dpo": "arithmetic-preference", "sft": "arithmetic-sft"}
DEFAULT_REWARDS = ["correctness", "format"]
#: The ways a run's nodes survive a preemption: None (checkpoint and restart) or TorchFT's groups.
FAULT_TOLERANCE = (None, "torchft")


@dataclass(frozen=True)
class TrainConfig:
    """One training run: what to train (model, data, rewards), how (TRL options, LoRA, seed,
    steps) and where (run directory), plus the checkpoint policy. Frozen: the node parses it
    once (`load`) and every part of the runtime reads that one object."""

    algorithm: str = "grpo"
    model: str = "tiny"
    dataset: str | None = None
    rewards: list[str] = field(default_factory=lambda: list(DEFAULT_REWARDS))
    trl: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None
    seed: int = 0
    max_steps: int = 100
    name: str | None = None
    run_dir: str | None = None
    dataset_config: str | None = None
    dataset_split: str = "train"
    dataset_size: int = 2000
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    script: str | None = None  # algorithm: script; a path inside the workdir
    args: list[str] = field(default_factory=list)  # the script's command-line arguments
    command: list[str] | None = None  # algorithm: script; a program run as it is
    #: "torchft": the run's nodes are replica groups under a TorchFT lighthouse (issue 50);
    #: None: one job whose ranks restart together from a checkpoint
    fault_tolerance: str | None = None

    def __post_init__(self) -> None:
        def default(key: str, value: Any) -> None:
            object.__setattr__(self, key, value)  # the defaults that follow from other fields

        if self.fault_tolerance not in FAULT_TOLERANCE:
            raise TrainConfigError(
                f"fault_tolerance must be one of {', '.join(map(repr, FAULT_TOLERANCE))}, "
                f"got {self.fault_tolerance!r:.60}: e.g. fault_tolerance='torchft'"
            )
        if self.algorithm == SCRIPT:
            default("dataset", self.dataset or "")
        if self.dataset is None:
            default("dataset", DEFAULT_DATASET.get(self.algorithm, "arithmetic"))
        if self.name is None:
            default(
                "name",
                Path(self.run_dir).name if self.run_dir else f"{self.algorithm}-{self.model}",
            )
        if self.run_dir is None:
            default("run_dir", str(default_home() / "runs" / str(self.name)))

    @property
    def planned_steps(self) -> int | None:
        """The steps the config plans: `max_steps`, or None for a script run (its program
        decides; it says so in ``RunStarted``)."""
        return None if self.algorithm == SCRIPT else self.max_steps

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data (what ``run.yaml`` holds)."""
        return dataclasses.asdict(self)

    def compact(self) -> dict[str, Any]:
        """The config in as few keys as read back as it (`from_dict`): its algorithm and name,
        and each field (each ``checkpoint:`` key) that differs from what `from_dict` fills in for
        them. What the node's config file holds (`tgnb.runs.node.render_config`)."""
        base = TrainConfig(algorithm=self.algorithm, name=self.name, run_dir=self.run_dir)
        mine, theirs = self.to_dict(), base.to_dict()
        out = {k: v for k, v in mine.items() if k in ("algorithm", "name") or v != theirs[k]}
        if "checkpoint" in out:
            ours, default = mine["checkpoint"], theirs["checkpoint"]
            out["checkpoint"] = {k: v for k, v in ours.items() if v != default[k]}
        return out

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the resolved config as YAML, atomically."""
        atomic_write(path, dump_yaml(self.to_dict()))


def unknown(kind: str, key: str, known: Iterable[str]) -> TrainConfigError:
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return TrainConfigError(f"unknown {kind} '{key}'.{hint}")


def field_names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def from_dict(raw: Mapping[str, Any]) -> TrainConfig:
    """A `TrainConfig` from plain data; unknown keys (top level or ``checkpoint:``) are errors."""
    if not isinstance(raw, Mapping):
        raise TrainConfigError("a training config must be a mapping of keys to values.")
    known = field_names(TrainConfig)
    for key in raw:
        if key not in known:
            raise unknown("config key", str(key), known)
    values = dict(raw)
    if "algorithm" not in values and (values.get("script") or values.get("command")):
        values["algorithm"] = "script"  # ``script: train.py`` alone says what it is
    policy = values.pop("checkpoint", None) or {}
    if not isinstance(policy, CheckpointPolicy):
        policy = CheckpointPolicy.parse(policy)
    if isinstance(values.get("rewards"), str):
        values["rewards"] = [values["rewards"]]
    if values.get("trl") is None:
        values["trl"] = {}
    if not isinstance(values["trl"], Mapping):
        raise TrainConfigError("'trl' must be a mapping of option names to values.")
    for key in ("seed", "max_steps", "dataset_size"):
        if key in values and not isinstance(values[key], int):
            raise TrainConfigError(f"'{key}' must be an integer, not {values[key]!r}.")
    return TrainConfig(**values, checkpoint=policy)
