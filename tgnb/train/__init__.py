"""The training runtime that runs on the GPU node: ``python -m tgnb.train CONFIG.yaml``.

This package's ``__init__`` stays light (no torch, TRL or transformers); those are imported inside
the functions that build and run a trainer.
"""

from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.tasks.policy import CheckpointPolicy

__all__ = ["EXIT_PREEMPTED", "CheckpointPolicy"]
