"""`Checkpointer(..., fault_tolerant=True)` refused in one line where it cannot run (issue 50):
without TorchFT installed, and outside a launch with ``fault_tolerance="torchft"`` when no
lighthouse is named; nothing is written. (Its training under replica groups:
tests/backends/local/test_replica_groups_loop.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tgnb.train
from tgnb.errors import TrainConfigError
from tgnb.runs import ft


def make(tmp_path: Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_without_a_lighthouse_it_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ft.LIGHTHOUSE_ENV, raising=False)
    model, opt = make(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(
        TrainConfigError, match=r"fault_tolerance='torchft'.*TORCHFT_LIGHTHOUSE="
    ) as e:
        tgnb.train.Checkpointer(model, opt, max_steps=3, dir=out, fault_tolerant=True)
    assert "\n" not in str(e.value)
    assert not out.exists()
    step = opt.step
    tgnb.train.Checkpointer(model, opt, max_steps=3, dir=out)  # without it: nothing changes
    assert opt.step == step  # not gated


def test_without_torchft_it_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ft.LIGHTHOUSE_ENV, "http://127.0.0.1:1")
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:  # this environment without the torchft wheel
        return None if name == ft.TORCHFT else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    model, opt = make(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(TrainConfigError, match=r"pip install 'tgnb\[torchft\]'") as e:
        tgnb.train.Checkpointer(model, opt, max_steps=3, dir=out, fault_tolerant=True)
    assert "\n" not in str(e.value)
    assert not out.exists()
