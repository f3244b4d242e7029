"""The guard for a Hugging Face / TRL ``Trainer``: its ``TrainerCallback`` and training arguments.

`GuardCallback` drives a `tgnb.train.preemption.CheckpointGuard` from the Trainer's hooks: the
step's timing (the guard's `CheckpointSchedule`), the agreed stop and save at each optimizer step's
end (``on_step_end``: `CheckpointGuard.step_boundary`), and on resume the DCP state loaded at
``on_train_begin`` -- once model and optimizer exist and are wrapped -- and the RNG restored where
the Trainer would. What the runner does with it (`tgnb.train.protect` does the same to a built
trainer)::

    guard = CheckpointGuard(policy, run_dir, recorder)     # installs the SIGTERM flag handler
    kwargs = batch_args(guard.ckpt_dir, kwargs, world)      # global batch kept at another world size
    args = GRPOConfig(**training_args(kwargs, guard.ckpt_dir))
    trainer = resumable(GRPOTrainer)(..., args=args, callbacks=[GuardCallback(guard)])
    guard.attach(trainer)
    trainer.train(resume_from_checkpoint=guard.resume_from())
    sys.exit(guard.finish(trainer))                         # 0 finished, 75 preempted, 74 disk full

Everything goes through ``TrainerCallback`` hooks and public APIs, plus one documented override
(`resumable`: ``Trainer._load_from_checkpoint`` does nothing, because the callback loads model and
optimizer from DCP; the Trainer still reads ``trainer_state.json`` and skips the data already
seen). No process-wide switch is touched. This module is what imports transformers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from tgnb.errors import TrainConfigError
from tgnb.train import checkpoint as ck
from tgnb.train import dcpio

if TYPE_CHECKING:
    from tgnb.train.preemption import CheckpointGuard

__all__ = ["OWNED_ARGS", "GuardCallback", "batch_args", "resumable", "training_args"]

#: What the guard sets in the training arguments: the Trainer's own saves and JIT checkpoint off
#: (the guard saves), data skipping on resume on.
_SETTINGS = {
    "save_strategy": "no",
    "save_total_limit": None,
    "save_only_model": False,
    "enable_jit_checkpoint": False,
    "ignore_data_skip": False,
}
#: Training arguments the guard owns; values given for them are replaced.
OWNED_ARGS = ("output_dir", "save_steps", *_SETTINGS)


def training_args(kwargs: dict[str, Any], ckpt_dir: Path) -> dict[str, Any]:
    """`kwargs` with the settings the guard owns (`OWNED_ARGS`), saving into `ckpt_dir`."""
    out = {k: v for k, v in kwargs.items() if k != "save_steps"}
    return {**out, **_SETTINGS, "output_dir": str(ckpt_dir)}


def resumable(trainer_cls: type) -> type:
    """`trainer_cls` with its one override: ``_load_from_checkpoint`` loads nothing (the guard
    loads the DCP state at ``on_train_begin``; see the module docstring)."""

    class Resumable(trainer_cls):
        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            """Model weights come from DCP at ``on_train_begin`` (`GuardCallback`)."""

    Resumable.__name__ = Resumable.__qualname__ = f"Resumable{trainer_cls.__name__}"
    return Resumable


def batch_args(ckpt_dir: Path, kwargs: dict[str, Any], world: int) -> dict[str, Any]:
    """Keep the global batch of the checkpoint to resume from (the Trainer skips the data seen by
    counting steps, so the data position holds only if every step is as large):
    ``gradient_accumulation_steps`` = its global batch / (per-device batch x `world`) when the
    world size or the per-device batch changed."""
    found = ck.checkpoint_dirs(ckpt_dir)
    meta = next((m.meta for p in found if (m := ck.read_marker(p)) is not None), None)
    per_device = int(kwargs.get("per_device_train_batch_size", 8))
    total = int(meta.get("global_batch") or 0) if meta else 0
    if not total or total == per_device * world * int(kwargs.get("gradient_accumulation_steps", 1)):
        return kwargs
    if total % (per_device * world):
        raise TrainConfigError(
            f"the checkpoint's global batch {total} is not a multiple of per-device batch "
            f"{per_device} x {world} ranks; set per_device_train_batch_size to a divisor "
            f"of {total // world}."
        )
    return {**kwargs, "gradient_accumulation_steps": total // (per_device * world)}


class GuardCallback(TrainerCallback):
    """The Trainer's step, epoch and train events, as the guard's (see the module docstring)."""

    def __init__(self, guard: CheckpointGuard) -> None:
        self.guard = guard
        self._rng_at: str | None = None  # "epoch" | "step": when to restore the resumed RNG

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        guard = self.guard
        if guard.resumed is None:
            return
        dcpio.load(guard.resumed.path, guard.trainer, guard.adapter_only)
        per_epoch = 1
        loader: Any = kwargs.get("train_dataloader")
        with contextlib.suppress(TypeError):
            n, ga = len(loader), int(args.gradient_accumulation_steps)
            per_epoch = max(n // ga + int(n % ga > 0), 1)
        # as the Trainer would: after skipping the data seen, or at the epoch's start if none
        self._rng_at = "step" if int(state.global_step) % per_epoch else "epoch"

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._rng_at == "epoch" and self.guard.resumed is not None:
            dcpio.load_rng(self.guard.resumed.path)
            self._rng_at = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._rng_at == "step" and self.guard.resumed is not None:
            dcpio.load_rng(self.guard.resumed.path)
        self._rng_at = None
        self.guard.schedule.step_began()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        batch = (
            int(args.per_device_train_batch_size)
            * dcpio.world()
            * int(args.gradient_accumulation_steps)
        )
        step, max_steps = int(state.global_step), int(state.max_steps)
        if self.guard.step_boundary(step, max_steps, batch, dcpio.flags_device()):
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard.saver is not None:
            self.guard.saver.wait()
        self.guard.stops.stop_watcher()
