"""The express checkpoint's metadata, taken at the step boundary it is of (`tgnb.train.express`).

A preemption's snapshot writes the last step boundary's state. Its tensors are read at the
snapshot: they do not change outside the update section (`tgnb.train.plan`). Its metadata -- the
optimizer's param groups and non-tensor state, the scheduler's state dict, the RNG states' other
parts, the ``TrainerState`` -- is small, and `BoundaryMeta.take` pickles it in the main thread as
the update section ends, at every step, where it costs tens of microseconds. In the snapshot the
same pickling took 0.2-0.8 ms (cold caches, a CPU shared with the abandoned step).

The trainer state's log history grows with the run, so it is kept apart (`LogHistory`): each
entry is pickled once, when it is first seen, into chunks of pickles written one after another
into the checkpoint and read back in order (`read_log`). The Trainer and TRL append new dicts to
the history and never change old ones; a history that is not the same list, or no longer holds
the last entry pickled where it was, is pickled again from the start.
"""

from __future__ import annotations

import array
import contextlib
import io
import pickle
from collections.abc import Callable
from typing import Any

from tgnb.train import fastsave

__all__ = ["BoundaryMeta", "LogHistory", "meta", "pack_rng", "read_log", "unpack_rng"]


def pack_rng(kind: str, value: Any) -> Any:
    """Python's RNG state with its 625 words as one ``array`` (pickled as a block of bytes,
    several times faster than a tuple of ints); other states as they are (`unpack_rng`)."""
    if kind == "python" and isinstance(value, tuple) and len(value) == 3:
        version, words, gauss = value
        with contextlib.suppress(TypeError, OverflowError):
            packed = array.array("I", words)
            if packed.itemsize == 4:
                return (version, packed, gauss)
    return value


def unpack_rng(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[1], array.array):
        return (value[0], tuple(value[1]), value[2])
    return value


def meta(trainer: Any, rng_rest: dict[str, Any], rng_order: list[str], optimizer: Any) -> bytes:
    """The pickled metadata of `trainer`'s express checkpoint: `optimizer` (its state dict
    without the tensors written apart), the scheduler's state dict, the RNG states' other parts
    (`rng_rest`, packed) in `rng_order`, and the ``TrainerState`` without its log history."""
    state = fastsave.trainer_state(trainer)  # a copy: its log history is written apart
    state.log_history = []
    record = {
        "optimizer": optimizer,
        "scheduler": trainer.lr_scheduler.state_dict(),
        "rng": rng_rest,
        "rng_order": rng_order,
        "trainer_state": state,
    }
    return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)


class LogHistory:
    """A trainer's log history pickled incrementally: `update` returns `chunks`, pickles of
    consecutive slices of it (at most `MERGE_AT` + 1 of them: they are joined beyond)."""

    MERGE_AT = 16

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self._list: list[Any] | None = None
        self._count = 0
        self._last: Any = None

    def update(self, history: list[Any]) -> list[bytes]:
        n = self._count
        if (
            history is not self._list
            or len(history) < n
            or (n and history[n - 1] is not self._last)
        ):
            self.chunks, n, self._list = [], 0, history
        if len(history) > n:
            self.chunks.append(pickle.dumps(history[n:], protocol=pickle.HIGHEST_PROTOCOL))
            if len(self.chunks) > self.MERGE_AT:
                self.chunks = [b"".join(self.chunks)]
            self._count, self._last = len(history), history[-1]
        return self.chunks


def read_log(blob: bytes) -> list[Any]:
    """The log history that `LogHistory` chunks, written one after another, hold."""
    out: list[Any] = []
    stream = io.BytesIO(blob)
    while stream.tell() < len(blob):
        out.extend(pickle.load(stream))
    return out


class BoundaryMeta:
    """The metadata of the last step boundary, taken by the main thread as its update section
    ends: `meta` (pickled) and `chunks` (the log history's), for boundary `step` with RNG states
    `rng` under `plan` (`tgnb.train.plan.Plan`, whose param groups and optimizer state it holds),
    and `layout`, what `layout_of(rng)` made of them (the file's layout, `tgnb.train.express`)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.plan: Any = None
        self.rng: dict[str, Any] = {}
        self.layout: Any = None
        self.meta = b""
        self.chunks: list[bytes] = []
        self._log = LogHistory()

    def take(
        self,
        trainer: Any,
        step: int,
        rng: dict[str, Any],
        plan: Any,
        layout_of: Callable[[dict[str, Any]], Any],
    ) -> None:
        self.step = None
        try:
            rest = {k: pack_rng(k, v) for k, v in rng.items() if not _is_tensor(v)}
            self.meta = meta(trainer, rest, list(rng), plan.optimizer_rest())
            self.chunks = self._log.update(trainer.state.log_history)
            self.layout = layout_of(rng)
        except Exception:  # never fail a step over it: the snapshot takes it all then
            return
        self.step, self.plan, self.rng = step, plan, rng


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)
