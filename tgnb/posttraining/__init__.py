"""The Together Post-Training API from Python and the notebook, over the SDK's
``together.post_training`` clients (the local emulator when no ``TOGETHER_API_KEY`` is set, else
Together: the default `tgnb.attach` shares)::

    import tgnb
    pt = tgnb.post_training()    # local=True: always the emulator; local=False: always Together
    res = pt.start("tgnb/tiny-llama", generators=1, inactive_timeout=900)
    sess = res.open_session(lora={"rank": 8, "alpha": 16}, name="lr-1e-4")
    sess.trainer.forward_backward(...); sess.trainer.optim_step(...)   # the SDK's own objects
    sess.record(reward_mean=0.4)
    tgnb.panel(res); res.cost(); sess.save("inference"); sess.download(variant="adapter", out="out")
    sess.stop(); res.stop()

Importing this package does not import the SDK: the clients are imported where they are used.
"""

from __future__ import annotations

from tgnb.posttraining.records import CheckpointInfo, Cost, ModelInfo, ResourceInfo, SessionInfo
from tgnb.posttraining.resource import PostTraining, Resource, post_training
from tgnb.posttraining.session import TrainingSession

__all__ = [
    "CheckpointInfo",
    "Cost",
    "ModelInfo",
    "PostTraining",
    "Resource",
    "ResourceInfo",
    "SessionInfo",
    "TrainingSession",
    "post_training",
]
