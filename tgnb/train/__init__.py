"""The training runtime that runs on the GPU node (``python -m tgnb.train CONFIG.yaml``), and the
public library a user's own training code calls:

- `protect` (``tgnb.train.protect(trainer)``): checkpoint-on-preemption and resume for any Hugging
  Face or TRL Trainer (`tgnb.train.protect`);
- `CheckpointPolicy`: when to checkpoint (``every_steps``, ``every_seconds``, ``auto``, ...);
- `EXIT_PREEMPTED` (75): the exit code that means "checkpointed, start me again".

This package's ``__init__`` stays light (no torch, TRL or transformers); those are imported inside
the functions that build and run a trainer.
"""

from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.tasks.policy import CheckpointPolicy
from tgnb.train.protect import protect

__all__ = ["EXIT_PREEMPTED", "CheckpointPolicy", "protect"]
