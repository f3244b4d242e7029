"""Metrics of a run as ``metrics.jsonl`` rows, and its start as a ``RunStarted`` event.

`MetricsCallback` turns each TRL log (``logging_steps``) into one row through
`tgnb.train.record.Recorder.metric`: step, time, loss, learning rate, tokens per second, and the
algorithm's own numbers under TRL's names -- for GRPO ``reward`` (mean), ``reward_std`` and
``rewards/<function>/mean``; for DPO ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``
and ``rewards/accuracies``. Only rank 0 writes (the Recorder checks).
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from tgnb.train.record import Recorder, number, run_failed, run_started

__all__ = ["MetricsCallback", "run_failed", "run_started"]

#: Log keys that summarise the whole of ``train()`` rather than a step; not written as a row.
_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


class MetricsCallback(TrainerCallback):
    """Writes one ``metrics.jsonl`` row per TRL log, with ``tokens_per_second`` added."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._last: tuple[float, float] | None = None  # (time, num_tokens) at the previous row

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last = (time.time(), float(getattr(state, "num_input_tokens_seen", 0) or 0))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or any(key in logs for key in _SUMMARY_KEYS):
            return
        row: dict[str, Any] = {}
        for key, value in logs.items():
            num = number(value)
            if num is not None:
                row[key] = num
        now = time.time()
        tokens = row.get("num_tokens")
        if tokens is not None:
            if self._last is not None and now > self._last[0] and tokens >= self._last[1]:
                row["tokens_per_second"] = (tokens - self._last[1]) / (now - self._last[0])
            self._last = (now, float(tokens))
        self.recorder.metric(int(state.global_step), **row)
