"""Writing a checkpoint's DCP shards (`tgnb.train.dcpio` has the layout, the reads and the rest).

`Writer` saves a state with ``dcp.save`` or ``dcp.async_save`` (at most one in flight), into
`tgnb.train.hashwriter.HashingWriter`, which checksums each file as it is written; asynchronous
saves stage the state into one reused CPU copy (`CachedStager`) and run their collectives on a
gloo group of their own. DCP's `CheckpointException` becomes a `CheckpointError` (`dcp_errors`).
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager

from tgnb.errors import CheckpointError
from tgnb.train import checkpoint as ck
from tgnb.train.dcpio import STATE_DIR, any_rank, dist_up, quiet, world
from tgnb.train.hashwriter import HashingWriter


def _layout(value: Any, at: str = "") -> list[tuple[Any, ...]]:
    """Every tensor of a nested state with where it is, its type, shape, dtype and device: two
    states with the same layout can be staged into the same CPU copy."""
    if isinstance(value, torch.Tensor):
        return [(at, type(value).__name__, tuple(value.shape), value.dtype, value.device.type)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _layout(v, f"{at}/{k}")]
    if isinstance(value, (list, tuple)):
        return [x for i, v in enumerate(value) for x in _layout(v, f"{at}/{i}")]
    return [(at, type(value).__name__)]


class CachedStager(AsyncStager):
    """Stages a state to CPU memory for ``dcp.async_save``: into one copy, made by the first save
    (pinned on a GPU machine) and refilled by the next ones with the same layout, so a later
    stall is a copy, not an allocation. Then one all-reduce on the saves' group: staging that fails
    on any rank (out of memory) fails ``dcp.async_save`` on every rank before DCP's collectives
    begin -- else the other ranks' background writes would wait for that rank forever.

    Not DCP's `DefaultStager`: torch 2.11's closes its deep-copier after every stage, and the
    second save then fails (``KeyError: <class 'type'>``) on every state (seen on an H200); the
    two functions used here are the ones DCP's own ``BlockingAsyncStager`` stages with."""

    _synchronize_after_execute = False

    def __init__(self, pinned: bool, group: Any) -> None:
        self.pinned = pinned
        self.group = group
        self._copy: dict[str, Any] | None = None
        self._layout: list[tuple[Any, ...]] = []

    def stage(self, state_dict: dict[str, Any], **kwargs: Any) -> Any:
        try:
            staged = self._stage(state_dict)
        except BaseException:
            any_rank([1], group=self.group)
            raise
        if any_rank([0], group=self.group)[0]:
            raise CheckpointError("staging the checkpoint failed on another rank (see its log)")
        return staged

    def _stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        layout = _layout(state_dict)
        if self._copy is None or layout != self._layout:
            self._copy = None  # the old copy goes before the new one is made
            self._copy = _create_cpu_state_dict(state_dict, pin_memory=self.pinned)
            self._layout = layout
        staged = _copy_state_dict(state_dict, self._copy, non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.synchronize()  # the copies are in the copy before training goes on
        return staged

    def synchronize_staging(self) -> None:
        """Staging is done when `stage` returns."""

    def close(self) -> None:
        self._copy = None


@contextlib.contextmanager
def dcp_errors() -> Iterator[None]:
    """DCP's `CheckpointException` (a `BaseException`, which ``except Exception`` lets through: a
    full disk in a synchronous save was a bare traceback and exit 1) as a `CheckpointError` with
    the first rank's error line, the DCP exception its cause (`tgnb.train.saving.no_space` reads
    a full disk through it)."""
    try:
        yield
    except CheckpointException as exc:
        failures = list(exc.failures.items())
        line = f"rank {failures[0][0]}: {failures[0][1][0]!r}" if failures else str(exc)
        raise CheckpointError(f"DCP could not write the checkpoint ({line[:300]})") from exc


class Writer:
    """Writes DCP states, synchronously or with ``dcp.async_save`` (at most one in flight).

    Several processes: asynchronous saves run their collectives on a gloo group of their own
    (made by every rank at its first save once torch.distributed is up, `_join`), so they never
    interleave with training's."""

    def __init__(self) -> None:
        self.group: Any = None
        self.inflight: Future[Any] | None = None
        #: the manifest entries of the files DCP wrote into each checkpoint, hashed as written
        self.written: dict[Path, dict[str, ck.FileEntry]] = {}
        # one stager for the run: its CPU copy is allocated by the first save, reused after
        self.stager = CachedStager(torch.cuda.is_available(), None)
        self._join()

    def _join(self) -> None:
        """Once torch.distributed is up, at any world size: the saves' own gloo group (an
        asynchronous save needs a CPU backend; the default group of a one-GPU run under a
        launcher is NCCL alone). Made by every rank, at its first save at the latest."""
        if self.group is None and dist.is_available() and dist.is_initialized():
            self.group = dist.new_group(backend="gloo")
            self.stager.group = self.group
            atexit.register(self.release)

    def release(self) -> None:
        """Let go of the saves' gloo group while the interpreter is still whole (at exit): left
        to the interpreter's teardown, its gloo threads can abort a run that finished
        ("terminate called without an active exception", SIGABRT, exit 1 from the launcher).
        Destroyed here unless a ``destroy_process_group()`` of the user's took it already."""
        group, self.group = self.group, None
        self.stager.group = None
        if group is not None and dist.is_initialized():
            with contextlib.suppress(ValueError):  # no longer registered: destroyed already
                dist.destroy_process_group(group)

    def _storage(self, path: Path) -> HashingWriter:
        """DCP's writer into the checkpoint `path`, checksumming as it writes: its entries are
        `written[path]` (`tgnb.train.hashwriter`)."""
        storage = HashingWriter(path / STATE_DIR, path)
        self.written[path] = storage.entries
        return storage

    def save(self, path: Path, state: dict[str, Any]) -> None:
        self._join()
        with quiet(), dcp_errors():
            dcp.save(state, storage_writer=self._storage(path), process_group=self.group)

    def close(self) -> None:
        self.stager.close()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, by rank, on every rank (on the saves' group, which the save before
        made: never made here, on the sealing thread)."""
        if self.group is None or not dist_up():
            return [obj]
        out: list[Any] = [None] * world()
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def save_async(self, path: Path, state: dict[str, Any]) -> Future[Any]:
        """Stage `state` to CPU memory now (the stall), write it in a background thread."""
        assert self.inflight is None or self.inflight.done(), "one asynchronous save at a time"
        self._join()
        with quiet(), dcp_errors():
            fut = dcp.async_save(
                state,
                storage_writer=self._storage(path),
                process_group=self.group,
                async_stager=self.stager,
            )
        assert isinstance(fut, Future)
        self.inflight = fut
        return fut

    def wait(self) -> BaseException | None:
        """Wait for the save in flight; its error, if it failed. (The staging buffer is reused:
        a save waits for the one before it.)"""
        fut, self.inflight = self.inflight, None
        if fut is None:
            return None
        try:
            fut.result()
        except BaseException as exc:
            return exc
        return None


__all__ = ["CachedStager", "Writer", "dcp_errors"]
