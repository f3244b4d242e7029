"""The training runtime that runs on the GPU node (``python -m tgnb.train CONFIG.yaml``), and the
public library a user's own training code calls:

- `protect` (``tgnb.train.protect(trainer)``): checkpoint-on-preemption and resume for any Hugging
  Face or TRL Trainer (`tgnb.train.protect`);
- `Checkpointer` (``tgnb.train.Checkpointer(model, optimizer, ...)``): the same for a plain PyTorch
  or Accelerate loop without a Trainer (`tgnb.train.loop`);
- `CheckpointPolicy`: when to checkpoint (``every_steps``, ``every_seconds``, ``auto``, ...);
- the two parts of their guard a program can use alone: `StopSignals` (SIGTERM / SIGUSR1 / a drain
  notice -> "stop requested", `tgnb.train.stops`) and `CheckpointSchedule` (when the next periodic
  checkpoint is due, `tgnb.train.schedule`);
- `ElasticSampler`: a ``DistributedSampler`` whose epoch a resume at another world size continues
  from the sample position (`tgnb.train.order`; ``Checkpointer.add_state("data", sampler)``);
- `EXIT_PREEMPTED` (75): the exit code that means "checkpointed, start me again".

This package's ``__init__`` stays light (no torch, TRL or transformers); those are imported inside
the functions that build and run a trainer, and `Checkpointer` (which imports torch) on first use.
"""

from typing import TYPE_CHECKING, Any

from tgnb.runs.policy import CheckpointPolicy
from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.train.protect import protect
from tgnb.train.schedule import CheckpointSchedule
from tgnb.train.stops import StopSignals

if TYPE_CHECKING:
    from tgnb.train.loop import Checkpointer
    from tgnb.train.order import ElasticSampler

__all__ = [
    "EXIT_PREEMPTED",
    "CheckpointPolicy",
    "CheckpointSchedule",
    "Checkpointer",
    "ElasticSampler",
    "StopSignals",
    "protect",
]


def __getattr__(name: str) -> Any:
    if name == "Checkpointer":  # imports torch: only when asked for
        from tgnb.train.loop import Checkpointer

        return Checkpointer
    if name == "ElasticSampler":  # imports torch: only when asked for
        from tgnb.train.order import ElasticSampler

        return ElasticSampler
    raise AttributeError(f"module 'tgnb.train' has no attribute {name!r}")
