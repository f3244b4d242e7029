"""A GRPO reward for the Slurm training tests, imported by the training job as
``paced_reward:paced`` (the job's PYTHONPATH holds this folder): the built-in format reward, after a
short sleep. It paces the tiny model's steps (about 0.05 s each on an idle machine) so that a
preemption or a drain notice at step 6 reliably lands seconds before the run could finish by itself.
The sleep costs wall-clock time only, not CPU."""

from __future__ import annotations

import time
from typing import Any

from tgnb.tasks.rewards import format_reward

PACE_S = 0.15


def paced(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    time.sleep(PACE_S)
    return format_reward(prompts, completions, **kwargs)
