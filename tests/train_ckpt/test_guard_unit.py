"""`CheckpointGuard` decisions at step boundaries, driven without a trainer (plain objects stand in
for the Trainer's args/state/control, which the guard only reads and sets flags on)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tgnb.backends.base import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck
from tgnb.train.policy import CheckpointPolicy
from tgnb.train.preemption import CheckpointGuard
from tgnb.train.record import Recorder


class Model:
    def __init__(self, nbytes: int) -> None:
        import torch

        self.p = torch.zeros(nbytes // 4, device="meta", requires_grad=True)

    def parameters(self) -> list[Any]:
        return [self.p]


def boundary(guard: CheckpointGuard, step: int, max_steps: int = 1000, model: Any = None) -> Any:
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    state = SimpleNamespace(global_step=step, max_steps=max_steps)
    guard.on_step_begin()
    guard.on_step_end(SimpleNamespace(device="cpu"), state, control, model or Model(400))
    return control


@pytest.fixture
def make_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("TGNB_NOTICE_FILE", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    guards: list[CheckpointGuard] = []

    def make(**policy: Any) -> CheckpointGuard:
        guard = CheckpointGuard(CheckpointPolicy(**policy), tmp_path, Recorder(tmp_path))
        guards.append(guard)
        return guard

    yield make
    for guard in guards:
        guard.close()


def test_training_args_take_over_the_save_settings(make_guard: Any, tmp_path: Path) -> None:
    guard = make_guard()
    kwargs = {"learning_rate": 1e-3, "save_steps": 5, "save_strategy": "steps", "output_dir": "x"}
    out = guard.training_args(kwargs)
    assert out["output_dir"] == str(tmp_path / "checkpoints")
    assert out["save_strategy"] == "no" and "save_steps" not in out
    assert out["save_total_limit"] is None and out["enable_jit_checkpoint"] is False
    assert out["learning_rate"] == 1e-3 and kwargs["save_steps"] == 5  # the input is not changed


def test_sigterm_only_sets_a_flag_then_the_boundary_saves_and_stops(make_guard: Any) -> None:
    guard = make_guard()
    assert not boundary(guard, 1).should_save
    os.kill(os.getpid(), signal.SIGTERM)  # the process survives: the handler only sets a flag
    deadline = time.monotonic() + 5
    while guard.signal_received is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert guard.signal_received is not None and guard.stop_reason is None
    control = boundary(guard, 2)
    assert control.should_save and control.should_training_stop and guard.stop_reason == "signal"
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=2, max_steps=1000))
    assert guard.finish(trainer) == EXIT_PREEMPTED
    assert signal.getsignal(signal.SIGTERM) is not guard._on_signal  # handler given back


def test_a_signal_during_the_last_step_is_a_finished_run(make_guard: Any) -> None:
    guard = make_guard()
    guard.request_stop("drain")
    control = boundary(guard, 10, max_steps=10)
    assert control.should_save and guard._save_reason == "final"
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=10, max_steps=10))
    assert guard.finish(trainer) == 0


def test_every_steps_and_every_seconds(make_guard: Any) -> None:
    guard = make_guard(every_steps=3)
    assert [boundary(guard, s).should_save for s in range(1, 8)] == [
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]
    guard = make_guard(every_seconds=0.05)
    assert not boundary(guard, 1).should_save
    time.sleep(0.06)
    assert boundary(guard, 2).should_save


def test_auto_uses_young_daly_in_steps(make_guard: Any) -> None:
    guard = make_guard(auto=True, preemptions_per_hour=3600.0)  # M = 1 s
    guard.step_time_s = 0.01
    guard.checkpoint_cost_s = 0.02  # sqrt(2 * 0.02 * 1) = 0.2 s = 20 steps
    guard._last_save_step = 100
    assert ck.young_daly_steps(0.02, 3600.0, 0.01) == 20
    guard._step_began = None
    state = SimpleNamespace(global_step=119, max_steps=1000)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    guard.on_step_end(SimpleNamespace(device="cpu"), state, control, Model(400))
    assert not control.should_save
    state.global_step = 120
    guard.on_step_end(SimpleNamespace(device="cpu"), state, control, Model(400))
    assert control.should_save and guard._save_reason == "periodic"
    # Before any save is measured, the cost is estimated from the model's size.
    fresh = make_guard(auto=True, preemptions_per_hour=3600.0)
    fresh.step_time_s = 0.01
    fresh._step_began = None
    state.global_step = 1
    control.should_save = False
    fresh.on_step_end(SimpleNamespace(device="cpu"), state, control, Model(400_000_000))
    assert control.should_save is False  # 3 * 400 MB / 200 MB/s = 6 s -> every 346 steps


def test_torch_save_skips_crc32_only_during_the_guards_save(
    make_guard: Any, tmp_path: Path
) -> None:
    """Between the save decision and ``on_save`` torch.save writes no CRC32 (the manifest's
    checksums cover those bytes); the setting is restored afterwards, and the file still loads."""
    import zipfile

    import torch
    import torch.serialization as ts

    guard = make_guard(every_steps=2)
    assert ts.get_crc32_options() is True
    assert not boundary(guard, 1).should_save and ts.get_crc32_options() is True
    assert boundary(guard, 2).should_save and ts.get_crc32_options() is False
    path = tmp_path / "checkpoints" / "checkpoint-2"
    path.mkdir(parents=True)
    torch.save({"w": torch.arange(1000.0)}, path / "optimizer.pt")  # as the Trainer would
    guard.on_save(SimpleNamespace(global_step=2))
    assert ts.get_crc32_options() is True
    with zipfile.ZipFile(path / "optimizer.pt") as zf:
        assert {i.CRC for i in zf.infolist()} == {0}
    assert torch.equal(torch.load(path / "optimizer.pt")["w"], torch.arange(1000.0))
    sealed = ck.verify(path)
    assert sealed is not None and sealed.step == 2 and guard.last_checkpoint == sealed
    # An abandoned save (training failed before on_save) is restored by close().
    assert boundary(guard, 4).should_save and ts.get_crc32_options() is False
    guard.close()
    assert ts.get_crc32_options() is True


def test_resume_first_names_a_checkpoint_left_sealed_in_the_spare(
    make_guard: Any, tmp_path: Path
) -> None:
    """A process killed between sealing its preemption checkpoint in the spare and renaming it
    leaves a complete checkpoint there: the next run renames it and resumes from it."""
    ckpts = tmp_path / "checkpoints"
    older = ckpts / "checkpoint-4"
    for path, step in ((older, 4), (ckpts / ck.STAGING, 6)):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(os.urandom(256))
        ck.write_marker(path, step)
    guard = make_guard()
    assert guard.resume_from() == str(ckpts / "checkpoint-6")
    assert guard.resumed_step == 6 and not (ckpts / ck.STAGING).exists()
    assert [p.name for p in ck.checkpoint_dirs(ckpts)] == ["checkpoint-6", "checkpoint-4"]
