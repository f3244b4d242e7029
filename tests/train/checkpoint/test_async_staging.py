"""Asynchronous saves, one after another, through the real `Saver` and DCP on the CPU.

Found on an H200 (torch 2.11): DCP's `DefaultStager` there closes its deep-copier after every
stage, so a run's second asynchronous save failed (``KeyError: <class 'type'>``) and every save
after it was skipped; and a one-GPU run under a launcher (torch.distributed up, world size 1, its
default group NCCL alone) could not save asynchronously at all ("A CPU backend must be enabled
for async save"). The first cannot be reproduced with this machine's torch, whose stager no longer
closes itself: the test below emulates that torch's stager, to show tgnb's path does not use it.
The second needs NCCL: here the world-size-1 group is gloo, and the test checks the writer has
its own gloo group for its saves whatever the default group's backend."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import staging

from tgnb.train import checkpoint as ck
from tgnb.train import dcpio, dcpwriter
from tgnb.train.record import Recorder
from tgnb.train.saving import Saver

META = {"world_size": 1, "global_batch": 1, "samples": 0, "adapter_only": False}


def _trainer(width: int = 32) -> Any:
    from transformers import TrainerState

    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    return SimpleNamespace(model=model, optimizer=opt, lr_scheduler=None, state=TrainerState())


def _saver(tmp_path: Path) -> Saver:
    recorder = Recorder(tmp_path)
    recorder.enabled = False
    return Saver(tmp_path / "checkpoints", recorder, keep_last=5)


@pytest.fixture
def closing_default_stager(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's `DefaultStager._stage`: it closes its `StateDictStager` after every stage."""
    original = staging.DefaultStager._stage

    def stage(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        out = original(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return out

    monkeypatch.setattr(staging.DefaultStager, "_stage", stage)


@pytest.mark.usefixtures("closing_default_stager")
def test_asynchronous_saves_one_after_another_all_seal_into_one_staging_copy(
    tmp_path: Path,
) -> None:
    trainer = _trainer()
    saver = _saver(tmp_path)
    copies = []
    for step in (1, 2, 3):
        trainer.model[0].weight.data.fill_(float(step))
        saver.save(trainer, step, "periodic", META, sync=False)
        saver.wait()
        assert saver.failure is None, saver.failure
        copy = saver.writer.stager._copy
        assert copy is not None
        copies.append(copy["model"]["0.weight"].data_ptr())
    assert copies[0] == copies[1] == copies[2]  # allocated once, refilled by later saves
    for step in (1, 2, 3):
        ckpt, why = ck.check(tmp_path / "checkpoints" / f"checkpoint-{step}")
        assert ckpt is not None, why
    fresh = _trainer()
    dcpio.load(tmp_path / "checkpoints" / "checkpoint-2", fresh, adapter_only=False)
    assert torch.equal(fresh.model[0].weight, torch.full_like(fresh.model[0].weight, 2.0))


def test_a_state_of_another_layout_is_staged_into_a_new_copy() -> None:
    stager = dcpwriter.CachedStager(pinned=False, group=None)
    first = stager.stage({"model": {"w": torch.ones(4, 4)}})
    again = stager.stage({"model": {"w": torch.full((4, 4), 2.0)}})
    assert again["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()
    assert torch.equal(again["model"]["w"], torch.full((4, 4), 2.0))
    grown = stager.stage({"model": {"w": torch.ones(4, 4)}, "optim": {"m": torch.zeros(3)}})
    assert set(grown) == {"model", "optim"} and torch.equal(grown["optim"]["m"], torch.zeros(3))


def test_with_torch_distributed_up_at_world_size_one_the_saves_have_their_own_gloo_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        saver = _saver(tmp_path)
        assert saver.writer.group is not None
        assert dist.get_backend(saver.writer.group) == "gloo"
        trainer = _trainer()
        for step in (1, 2):
            saver.save(trainer, step, "periodic", META, sync=False)
            saver.wait()
        assert saver.failure is None
        assert ck.check(tmp_path / "checkpoints" / "checkpoint-2")[0] is not None
        saver.writer.release()
    finally:
        dist.destroy_process_group()
