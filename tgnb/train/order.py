"""An epoch's data order that a resume continues from the sample position, at any world size.

A ``DistributedSampler`` draws one global order per epoch (``randperm`` seeded by ``seed + epoch``,
the same at every world size) and hands rank ``r`` of ``W`` the positions ``r, r + W, ...``. After
``k`` batches of ``B`` on every rank the first ``k * B * W`` positions of that order are trained,
whatever ``W`` was. Skipping ``k`` batches again after a resume at another world size ``W'`` skips
``k * B * W'`` positions instead: samples trained twice (``W' > W``) or never (``W' < W``).

`ElasticSampler` is a ``DistributedSampler`` that, given the samples of an epoch trained globally
(`resume_at`), hands the ranks the rest of that epoch's global order, split the same way at the
new world size; the next epochs are the plain sampler's. It counts the samples its ranks drew
(`state_dict`: ``{"epoch", "samples"}``), so `tgnb.train.Checkpointer.add_state` saves the data
position with the run: ``samples`` is what this rank's iterator drew times the world size, exact
when the ``DataLoader`` draws no batch ahead (``num_workers=0``; workers draw ahead, and the
position saved would be ahead by what they drew). `tgnb.train.lightning` turns the sampler Lightning
injects (``use_distributed_sampler=True``) into one on a resume at another world size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

__all__ = ["ElasticSampler", "elastic", "global_batch_line"]


class ElasticSampler(DistributedSampler):
    """A ``DistributedSampler`` resumable at the sample position (see the module docstring)."""

    _resume: tuple[int, int] | None = None  # (epoch, samples of it trained globally)
    _drawn = 0  # indices this rank's iterator of the current epoch handed out

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        if not (dist.is_available() and dist.is_initialized()):  # one process, no group
            num_replicas = 1 if num_replicas is None else num_replicas
            rank = 0 if rank is None else rank
        super().__init__(dataset, num_replicas, rank, **kwargs)

    def resume_at(self, epoch: int, samples: int) -> None:
        """Continue `epoch` after its first `samples` positions (trained by all ranks together)."""
        self.set_epoch(epoch)
        self._resume = (epoch, max(0, int(samples)))

    def state_dict(self) -> dict[str, int]:
        done = self._resume[1] if self._resume and self._resume[0] == self.epoch else 0
        return {"epoch": int(self.epoch), "samples": done + self._drawn * self.num_replicas}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_at(int(state["epoch"]), int(state["samples"]))

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._drawn = 0
        super().set_epoch(epoch)

    def _rest(self) -> list[int]:
        assert self._resume is not None
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
        else:
            order = list(range(len(self.dataset)))  # type: ignore[arg-type]
        rest = order[self._resume[1] :]
        if self.drop_last:
            return rest[: len(rest) - len(rest) % self.num_replicas]
        pad = -len(rest) % self.num_replicas  # as the plain sampler pads: from the front
        while pad > 0 and rest:
            rest += rest[:pad]
            pad = -len(rest) % self.num_replicas
        return rest

    def __iter__(self) -> Iterator[int]:
        self._drawn = 0
        if self._resume is None or self._resume[0] != self.epoch:
            self._resume = None
            mine: Iterator[int] = super().__iter__()
        else:
            mine = iter(self._rest()[self.rank :: self.num_replicas])
        for index in mine:
            self._drawn += 1
            yield index

    def __len__(self) -> int:
        if self._resume is None or self._resume[0] != self.epoch:
            return int(self.num_samples)
        # the epoch's whole share: the skipped part counts, so the loader's length stays the
        # epoch's (Lightning ends the epoch by it, from the batch counters it restored)
        skipped = -(-self._resume[1] // self.num_replicas)
        return skipped + len(self._rest()) // self.num_replicas


def elastic(sampler: Any) -> ElasticSampler | None:
    """`sampler` (a ``DistributedSampler`` of torch's own) as an `ElasticSampler`, in place; None
    for any other sampler (its order is not known to be the same at every world size)."""
    if isinstance(sampler, ElasticSampler):
        return sampler
    if type(sampler) is not DistributedSampler:
        return None
    sampler.__class__ = ElasticSampler
    return sampler  # type: ignore[return-value]


def global_batch_line(saved_world: int, world: int, batch: int) -> str:
    """The line a resume at another world size prints: the global batch it changes (`batch`:
    samples per rank and step; 0 when unknown)."""
    if batch <= 0:
        return (
            f"tgnb: resumed at world size {world} (saved at {saved_world}): the global batch is "
            f"now {world}/{saved_world} of the saved one"
        )
    return (
        f"tgnb: resumed at world size {world} (saved at {saved_world}): the global batch is now "
        f"{batch * world} samples per step (was {batch * saved_world}); the epoch continues from "
        f"its sample position, each sample once"
    )
