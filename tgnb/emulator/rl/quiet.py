"""peft's warnings that do not apply to the emulator's engine, silenced around its own calls only."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft's notices that do not apply here: the LoRA on a tied unembedding (merged exports untie
    it first), the active adapter moving on deletion (we set it on every call), GPT-2's Conv1D
    layers (peft transposes them itself), and a
    transformers deprecation peft triggers."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*", category=UserWarning)
        warnings.filterwarnings("ignore", message="Adapter .* was active", category=UserWarning)
        warnings.filterwarnings("ignore", message="fan_in_fan_out", category=UserWarning)
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        yield
