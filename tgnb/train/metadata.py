"""The express checkpoint's metadata (`tgnb.train.express`): what it holds besides tensors.

`meta` pickles the optimizer's param groups and non-tensor state, the scheduler's state dict,
the RNG states' other parts and the ``TrainerState`` without its log history; Python's RNG
state goes in as one array of words (`pack_rng`), which pickles several times faster than its
tuple of 625 ints.

The log history grows with the run, and pickling all of it at each preemption would make the
save grow with it. So it is kept apart (`LogHistory`): each entry is pickled once, into chunks
of pickles written one after another into the checkpoint and read back in order (`read_log`).
The spare's keeper brings it up to date every few dozen steps; the snapshot pickles only the
entries logged since. The Trainer and TRL append new dicts to the history and never change old
ones; a history that is not the same list, or no longer holds the last entry pickled where it
was, is pickled again from the start.
"""

from __future__ import annotations

import array
import contextlib
import io
import pickle
from typing import Any

from tgnb.train import fastsave

__all__ = ["LogHistory", "meta", "pack_rng", "read_log", "unpack_rng"]


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
