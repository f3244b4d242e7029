"""The ``TrainerCallback`` of a `tgnb.train.preemption.CheckpointGuard` (all decisions are the
guard's; this module is what imports transformers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from tgnb.train.preemption import CheckpointGuard


class GuardCallback(TrainerCallback):
    """Forwards the Trainer's step, epoch and train events to the guard."""

    def __init__(self, guard: CheckpointGuard) -> None:
        self.guard = guard

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_train_begin(args, state, kwargs.get("train_dataloader"))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_epoch_begin()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_step_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_step_end(args, state, control)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard.saver is not None:
            self.guard.saver.wait()
        self.guard.stop_watcher()
