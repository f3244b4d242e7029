"""What a built-in model needs of the runtime: its TRL defaults per algorithm, the weights of the
default rewards, activation checkpointing, CPU threads. `tgnb.train.runner` reads `tuning(model)`
generically; a model without an entry (any Hugging Face id or path) gets TRL's own defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tgnb.tasks.assets import TINY


@dataclass(frozen=True)
class ModelTuning:
    """`trl`: options per algorithm, under the run's own ``trl:`` keys (which win).
    `reward_weights`: for GRPO with the default rewards [correctness, format].
    `activation_checkpointing`: on or off (None: TRL's default). `cpu_threads`: torch's
    intra-op threads when there is no GPU (None: torch's default)."""

    trl: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reward_weights: tuple[float, ...] | None = None
    activation_checkpointing: bool | None = None
    cpu_threads: int | None = None


#: The built-in tiny model on the built-in tasks: a large learning rate, one-token answers (the
#: built-in answers are single digits), 8 prompts x 8 generations per step. Tuned so that
#: correctness (not only the format) is learnt within about 100 steps: at 5e-3 the policy
#: collapses onto the most frequent answer before it learns to read the question. The format
#: reward is a small shaping term, so that answering right dominates the mean reward. Tiny
#: matmuls gain nothing from threads (on a busy CPU they lose), nor from activation checkpointing.
TINY_TUNING = ModelTuning(
    trl={
        "grpo": {
            "learning_rate": 2e-3,
            "num_generations": 8,
            "per_device_train_batch_size": 64,
            "max_completion_length": 1,
            "temperature": 1.0,
        },
        # DPO: rewards/accuracies goes from about 0.65 to 0.89 in 60 steps (5e-3 oscillates)
        "dpo": {"learning_rate": 1e-3, "per_device_train_batch_size": 8, "max_length": 32},
        # SFT on prompt/completion: the loss on the one-token answers falls within about 50 steps
        "sft": {"learning_rate": 1e-3, "per_device_train_batch_size": 8, "max_length": 32},
    },
    reward_weights=(1.0, 0.1),
    activation_checkpointing=False,
    cpu_threads=1,
)

_TUNINGS: dict[str, ModelTuning] = {TINY: TINY_TUNING}


def tuning(model: str | None) -> ModelTuning | None:
    """The tuning of a built-in `model`, None for any other."""
    return _TUNINGS.get(model) if model else None
