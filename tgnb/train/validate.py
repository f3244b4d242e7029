"""The checks of a run's config that need TRL or peft, or its run directory: made on the node
before anything is trained. The light ones (`tgnb.tasks.config.check_light`) the launch makes
before a run is recorded; the node trusts them for the config it reads from its run file
(`tgnb.runs.runfile`) and makes them first for a config a person gives ``tgnb train``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.tasks import data, rewards
from tgnb.tasks.config import (
    SCRIPT,
    TrainConfig,
    check_light,
    check_script,
    field_names,
    unknown,
)


def trl_config_class(algorithm: str) -> Any:
    """``GRPOConfig``, ``DPOConfig`` or ``SFTConfig``."""
    if algorithm == "grpo":
        from trl import GRPOConfig

        return GRPOConfig
    if algorithm == "sft":
        from trl import SFTConfig

        return SFTConfig
    from trl import DPOConfig

    return DPOConfig


def validate(cfg: TrainConfig, workdir: Path | None = None, *, launched: bool = False) -> None:
    """Raise `TrainConfigError` (one line, naming the fix) for anything that cannot run; relative
    dataset paths and reward modules are taken in `workdir` (default: the run's snapshot, else
    the working directory). `launched`: a launch validated `cfg` (`check_light`), so only what
    needs this node is checked: the data's columns and the rewards in the run's snapshot, TRL's
    and peft's option names (they are installed here), the run's checkpoints, a script's
    imports."""
    if workdir is None:
        from tgnb.train.program import workdir_of

        workdir = workdir_of(Path(cfg.run_dir or "."))
    if not launched:
        check_light(cfg, workdir)
    if cfg.algorithm == SCRIPT:
        check_script(cfg, workdir)
        return
    assert cfg.dataset is not None
    columns = data.check_columns(cfg.dataset, cfg.algorithm, workdir)
    if cfg.algorithm == "grpo":
        import sys

        if str(workdir) not in sys.path:
            sys.path.insert(0, str(workdir))
        rewards.resolve_all(cfg.rewards, columns)
    known = set(field_names(trl_config_class(cfg.algorithm)))
    for key in cfg.trl:
        if key not in known:
            raise unknown(f"TRL option for {cfg.algorithm.upper()}", str(key), known)
    from tgnb.train.callback import OWNED_ARGS

    owned = sorted(set(cfg.trl) & set(OWNED_ARGS))
    if owned:
        raise TrainConfigError(
            f"trl.{owned[0]} is set by the checkpoint guard; configure checkpointing under "
            "'checkpoint:' (every_steps, every_seconds, auto, keep_last) instead."
        )
    if cfg.lora is not None:
        from peft import LoraConfig

        lora_keys = field_names(LoraConfig)
        for key in cfg.lora:
            if key not in lora_keys:
                raise unknown("LoRA option", str(key), lora_keys)
    check_resume(cfg)


class RunFinished(Exception):
    """A restart found the run's last checkpoint at max_steps: the run is done (exit 0)."""


def _restarted() -> bool:
    from tgnb.runs.node import restart_count

    return restart_count() > 0


def check_resume(cfg: TrainConfig) -> None:
    """max_steps must lie above the step of the checkpoint the run would resume from. On a
    restart (``TGNB_RESTART_COUNT`` or ``SLURM_RESTART_COUNT`` above 0) a checkpoint at exactly
    max_steps means the run finished and was requeued anyway (a preemption landed after its last
    save): `RunFinished`, which the CLI turns into exit 0, instead of a bad-config failure."""
    from tgnb.train.checkpoint import latest_complete

    assert cfg.run_dir is not None
    ckpt = latest_complete(Path(cfg.run_dir) / "checkpoints", checksums=False)
    if ckpt is not None and cfg.max_steps == ckpt.step and _restarted():
        raise RunFinished(
            f"the run already finished: checkpoint '{ckpt.path.name}' is at max_steps "
            f"{cfg.max_steps}; nothing left to train"
        )
    if ckpt is not None and cfg.max_steps <= ckpt.step:
        raise TrainConfigError(
            f"max_steps={cfg.max_steps} is not above step {ckpt.step} of checkpoint "
            f"'{ckpt.path.name}' in {cfg.run_dir}; raise max_steps or use a new run directory."
        )
