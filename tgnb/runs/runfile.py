"""The run file (`tgnb.runs.node.RUN_FILE`, ``run.json``): the one typed file each engine writes
per submit, beside the node's config view, and what the node's runtime reads.

It holds the run's contract as the launch validated it (`RunSpec.to_dict`, with its ``schema``) and
the time of the launch. The run directory is not in its training config: the node's command line
gives it (``--run-dir``), as for ``config.yaml``. The node reads it once (`RunFile.load`) and trusts
it: the checks the launch made (`tgnb.tasks.config.check_light`) are not made again there; what only
the node can check (TRL's and peft's option names, the run's checkpoints, a script's imports) still
is (`tgnb.train.validate`). What the node used to get in other carriers is a view of it:

- ``config.yaml`` (`config_yaml`): the training config in few keys, for a person to read and for
  ``tgnb train config.yaml`` by hand;
- ``$TGNB_CHECKPOINT``: the training config's checkpoint policy, which the runtime gives the
  user's program (`tgnb.train.program.environment`) beside the run file's path
  (`tgnb.runs.node.RUN_FILE_ENV`), where `tgnb.train.protect` reads the policy;
- the budget the node holds (`budget`);
- ``placer.json`` (`placer_config`, a `PlacerConfig`): what a run's placer decides by, one schema
  on every engine, which both placers load typed (`PlacerConfig.load`).

No secret is in it: a spec holds secrets by reference only (`tgnb.runs.spec.check_no_secrets`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError, ValidationError
from tgnb.runs import node
from tgnb.runs.budget import Budget
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.spec import SCHEMA, RunSpec, pop_schema
from tgnb.runs.trainconfig import TrainConfig


@dataclass(frozen=True)
class RunFile:
    """One submit of a run: its `spec` (its ``train`` as this start runs it) and when it was
    `launched` (epoch seconds: a deadline counts from it)."""

    spec: RunSpec
    launched: float

    @property
    def train(self) -> TrainConfig:
        return self.spec.train

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec.to_dict()
        spec.pop("schema")  # one version for the whole file
        spec["train"].pop("run_dir")  # the launching machine's default: the node is told its own
        return {"schema": SCHEMA, "launched": self.launched, "spec": spec}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunFile:
        if not isinstance(data, Mapping) or not isinstance(data.get("spec"), Mapping):
            raise ValidationError("not a run file as tgnb writes it: no 'spec' mapping")
        launched = data.get("launched")
        if isinstance(launched, bool) or not isinstance(launched, int | float):
            raise ValidationError(
                f"run file 'launched' must be epoch seconds, got {launched!r:.40}"
            )
        schema = data.get("schema", 0)
        return cls(RunSpec.from_dict({**data["spec"], "schema": schema}), float(launched))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunFile:
        """The run file at `path`, typed; a `TrainConfigError` (the node exits `Exit.BAD_CONFIG`)
        naming the fix when it is missing or not one tgnb wrote."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except OSError as exc:
            raise TrainConfigError(
                f"run file '{path}' cannot be read ({exc.strerror}): launch the run through tgnb, "
                "which writes it"
            ) from None
        except (ValueError, ValidationError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TrainConfigError(
                f"run file '{path}' is not one tgnb wrote ({first:.200}): launch the run again"
            ) from None

    def with_train(self, train: TrainConfig) -> RunFile:
        """This submit with `train` (the local engine's re-estimated checkpoint policy)."""
        return replace(self, spec=replace(self.spec, train=train))

    # -- the views ---------------------------------------------------------------------------------

    def config_yaml(self) -> str:
        """``config.yaml``: the training config in few keys (`TrainConfig.compact`)."""
        return node.render_config(self.train.compact())

    def budget(self) -> Budget | None:
        """The budget the node holds (None: the run has none)."""
        return Budget.of(self.spec)

    def placer_config(self, poll_s: float, **engine: Any) -> PlacerConfig:
        """``placer.json`` (`PlacerConfig`): what a run's placer needs to decide, nothing more
        (no env, no secrets): the run's recovery policy, size and planned steps, its launch (a
        deadline counts from it), how often to look, and the engine's own keys (`engine`: Slurm's
        ``partition`` and ``cpus_per_task``, Kubernetes' ``namespace``, ``run_dir`` and
        ``deployment``)."""
        res = self.spec.resources
        return PlacerConfig(
            run=self.spec.name,
            policy=self.spec.policy,
            nodes=res.nodes,
            min_nodes=res.min_nodes,
            gpus_per_node=res.gpus_per_node,
            max_steps=self.train.planned_steps,
            launched=self.launched,
            poll_s=poll_s,
            **engine,
        )


#: The keys of ``placer.json`` that only one engine writes, in the order it writes them.
SLURM_KEYS = ("cpus_per_task", "partition")
KUBE_KEYS = ("namespace", "run_dir", "deployment")


@dataclass(frozen=True)
class PlacerConfig:
    """``placer.json``, typed: what a run's placer (the Slurm placer job, the Kubernetes placer
    pod) decides by, a view of the run file (`RunFile.placer_config`) with one schema version.
    The engine's own keys are set on its engine only: Slurm's (`SLURM_KEYS`) when
    `cpus_per_task` is, Kubernetes' (`KUBE_KEYS`) when `namespace` is."""

    run: str
    policy: RecoveryPolicy
    nodes: int
    gpus_per_node: int
    launched: float  # epoch seconds: a deadline counts from it
    min_nodes: int | None = None
    max_steps: int | None = None
    poll_s: float = 5.0
    cpus_per_task: int | None = None  # Slurm
    partition: str | None = None  # Slurm
    namespace: str | None = None  # Kubernetes
    run_dir: str | None = None  # Kubernetes: the run directory as the placer pod mounts it
    deployment: str | None = None  # Kubernetes: the placer's own Deployment
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema,
            "run": self.run,
            "policy": self.policy.to_dict(),
            "nodes": self.nodes,
            "min_nodes": self.min_nodes,
            "gpus_per_node": self.gpus_per_node,
            "max_steps": self.max_steps,
            "launched": self.launched,
            "poll_s": self.poll_s,
        }
        for keys, engine in ((SLURM_KEYS, self.cpus_per_task), (KUBE_KEYS, self.namespace)):
            if engine is not None:
                out.update({k: getattr(self, k) for k in keys})
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacerConfig:
        """The ``placer.json`` `to_dict` wrote, of this schema or an older one (one without
        ``schema`` was written before the field, and reads the same); a `ValidationError` naming
        the fix otherwise."""
        if not isinstance(data, Mapping):
            raise ValidationError("not a placer.json as tgnb writes it: not a JSON object")
        d = dict(data)
        schema = pop_schema(d, "placer.json", "where the placer runs")
        missing = [k for k in ("run", "policy", "nodes", "gpus_per_node", "launched") if k not in d]
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if missing or unknown or not isinstance(d["policy"], Mapping):
            what = f"no {missing[0]!r}" if missing else f"unknown key {unknown[0]!r:.40}"
            what = what if missing or unknown else "'policy' is not a mapping"
            raise ValidationError(f"not a placer.json as tgnb writes it ({what}): launch again")
        d["policy"] = RecoveryPolicy.from_dict(d["policy"])
        d["poll_s"] = float(d.get("poll_s") or 5.0)
        d["launched"] = float(d["launched"])
        return cls(schema=schema, **d)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PlacerConfig:
        """The ``placer.json`` at `path`, typed."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
