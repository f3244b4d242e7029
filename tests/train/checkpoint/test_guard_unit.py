"""`CheckpointGuard` decisions and saves at step boundaries, driven without TRL: a real torch model,
optimizer and scheduler and a real ``TrainerState`` stand in for the Trainer (the guard reads only
those), so every save is a real DCP save sealed by a real marker."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import TrainerState

from tests.conftest import wait_until
from tgnb.backends.base import EXIT_PREEMPTED
from tgnb.errors import CheckpointError
from tgnb.runs.node import Exit
from tgnb.runs.policy import CheckpointPolicy
from tgnb.train import checkpoint as ck
from tgnb.train import dcpio, dcpwriter
from tgnb.train.callback import GuardCallback, batch_args, training_args
from tgnb.train.preemption import CheckpointGuard
from tgnb.train.record import Recorder

ARGS = SimpleNamespace(device="cpu", per_device_train_batch_size=2, gradient_accumulation_steps=1)


def make_trainer(n: int = 32) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(n, n), torch.nn.Linear(n, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, n)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    state = TrainerState(global_step=0, max_steps=1000)
    return SimpleNamespace(
        model=model, optimizer=opt, lr_scheduler=sched, state=state, save_model=lambda p: None
    )


def boundary(guard: CheckpointGuard, trainer: Any, step: int, max_steps: int = 1000) -> Any:
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    trainer.state.global_step, trainer.state.max_steps = step, max_steps
    callback = GuardCallback(guard)
    callback.on_step_begin(ARGS, trainer.state, control)
    callback.on_step_end(ARGS, trainer.state, control)
    return control


@pytest.fixture
def make_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("TGNB_NOTICE_FILE", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    guards: list[CheckpointGuard] = []

    def make(run_dir: Path = tmp_path, **policy: Any) -> tuple[CheckpointGuard, Any]:
        guard = CheckpointGuard(CheckpointPolicy(**policy), run_dir, Recorder(run_dir))
        trainer = make_trainer()
        guard.attach(trainer)
        guards.append(guard)
        return guard, trainer

    yield make
    for guard in guards:
        guard.close()


def events(run_dir: Path, reason: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["reason"] == reason]


def test_training_args_take_over_the_save_settings(make_guard: Any, tmp_path: Path) -> None:
    guard, _ = make_guard()
    kwargs = {"learning_rate": 1e-3, "save_steps": 5, "save_strategy": "steps", "output_dir": "x"}
    out = training_args(kwargs, guard.ckpt_dir)
    assert out["output_dir"] == str(tmp_path / "checkpoints")
    assert out["save_strategy"] == "no" and "save_steps" not in out
    assert out["enable_jit_checkpoint"] is False and kwargs["save_steps"] == 5


def test_sigterm_sets_a_flag_then_the_boundary_saves_synchronously_and_stops(
    make_guard: Any, tmp_path: Path
) -> None:
    guard, trainer = make_guard()
    assert not boundary(guard, trainer, 1).should_training_stop
    os.kill(os.getpid(), signal.SIGTERM)  # the process survives: the handler only sets a flag
    wait_until(lambda: guard.stops.signal_received is not None, 5, what="the handler", every=0.01)
    assert guard.stop_reason is None
    assert boundary(guard, trainer, 2).should_training_stop and guard.stop_reason == "signal"
    latest = ck.latest_complete(tmp_path / "checkpoints")
    assert latest is not None and latest.step == 2 and latest.meta["trigger"] == "signal"
    names = {f.path for f in latest.files}
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "rng-0.safetensors", "optimizer.json"} <= names
    assert not [n for n in names if n.endswith((".pt", ".pth", ".bin"))]  # no pickles but DCP's
    assert guard.finish(trainer) == EXIT_PREEMPTED
    assert signal.getsignal(signal.SIGTERM) != guard.stops._on_signal  # handler given back
    assert events(tmp_path, "RunExited")[-1]["data"]["exit_code"] == EXIT_PREEMPTED


def test_a_signal_during_the_last_step_is_a_finished_run(make_guard: Any) -> None:
    guard, trainer = make_guard()
    guard.stops.request("drain")
    boundary(guard, trainer, 10, max_steps=10)
    assert guard.finish(trainer) == 0


def test_every_steps_saves_asynchronously_and_every_seconds(
    make_guard: Any, tmp_path: Path
) -> None:
    guard, trainer = make_guard(every_steps=3)
    for s in range(1, 8):
        boundary(guard, trainer, s)
    guard.saver.wait()
    saved = [e["data"] for e in events(tmp_path, "CheckpointSaved")]
    assert [(d["step"], d["trigger"]) for d in saved] == [(3, "periodic"), (6, "periodic")]
    guard, trainer = make_guard(tmp_path / "b", every_seconds=0.05)
    boundary(guard, trainer, 1)
    assert guard.saver.last is None
    time.sleep(0.06)
    boundary(guard, trainer, 2)
    guard.saver.wait()
    assert guard.saver.last is not None and guard.saver.last.step == 2


def test_auto_uses_young_daly_with_the_measured_stall(make_guard: Any) -> None:
    # as many failures as preemptions, one a second: sqrt(2 x 0.02 + 0.02^2) = 0.2 s = 20 steps
    guard, _ = make_guard(auto=True, preemptions_per_hour=3600.0, failures_per_hour=3600.0)
    guard.schedule.step_time_s = 0.01
    guard.saver.stall_s = 0.02  # the write time is not known yet: taken as the stall
    guard.saver.last_step = 100
    assert not guard.periodic_due(119) and guard.periodic_due(120)
    guard.saver.write_s = 0.3  # + waiting for a save in flight at a notice: 0.36 s = 36 steps
    assert not guard.periodic_due(135) and guard.periodic_due(136)
    guard.saver.stall_s = guard.saver.write_s = None  # before any save: from the size saved
    assert guard.periodic_due(101)  # a tiny model: a tiny stall, a save every step
    guard, _ = make_guard(auto=True, preemptions_per_hour=3600.0, failures_per_hour=900.0)
    guard.schedule.step_time_s, guard.saver.stall_s, guard.saver.write_s = 0.01, 0.02, 0.3
    guard.saver.last_step = 100  # failures rarer: sqrt(4 x 0.13) s
    assert not guard.periodic_due(171) and guard.periodic_due(172)
    off = {"on_signal": False, "watch_drain": False}  # no notice seen: preemptions are failures
    guard, _ = make_guard(auto=True, preemptions_per_hour=3600.0, failures_per_hour=1e-9, **off)
    guard.schedule.step_time_s, guard.saver.stall_s, guard.saver.write_s = 0.01, 0.02, 0.3
    guard.saver.last_step = 100  # sqrt(2 x 0.02 x 1) = 0.2 s
    assert not guard.periodic_due(119) and guard.periodic_due(120)


def announced(run_dir: Path) -> list[dict[str, Any]]:
    return events(run_dir, "CheckpointIntervalChosen")


def test_auto_announces_each_change_of_its_interval_in_plain_words(
    make_guard: Any, tmp_path: Path
) -> None:
    source = "0.8 preemptions per node-hour (0.8 observed: 2 over 2.5 node-hours ...)"
    guard, _ = make_guard(
        auto=True,
        preemptions_per_hour=0.5,  # the setting: a prior the observed rate replaced
        observed_preemptions_per_hour=3600.0,
        failures_per_hour=3600.0,
        preemptions_source=source,
    )
    guard.schedule.step_time_s, guard.saver.stall_s, guard.saver.write_s = 0.01, 0.02, None
    guard.saver.last_step = 100
    guard.periodic_due(110)
    guard.periodic_due(111)
    said = announced(tmp_path)
    assert len(said) == 1  # the first interval; the same again is not announced
    first = said[0]
    assert first["message"].startswith("checkpoint every 20 steps (0.2 s): a save pauses "
                                       "training 0.02 s (measured); expected an hour: 3,600 "
                                       "interruptions with no notice, 3,600 preemptions with "
                                       "one (estimated from the preemptions seen on the "
                                       "cluster)"), first  # fmt: skip
    assert "observed:" not in first["message"] and "node-hours" not in first["message"]
    data = first["data"]
    assert (data["every_steps"], data["every_s"], data["step"]) == (20, 0.2, 110)
    assert (data["stall_s"], data["stall_measured"], data["source"]) == (0.02, True, "observed")
    assert data["detail"] == source and data["was_steps"] is None
    # a small change (sqrt(2 x 0.025 + 0.025^2) s = 22.5 steps): within a quarter, not
    # announced, and the interval in force stays the one announced
    guard.saver.stall_s = 0.025
    assert not guard.periodic_due(119) and guard.periodic_due(120)
    assert len(announced(tmp_path)) == 1
    # a large one (sqrt(2 x 0.08 + 0.08^2) s = 40.8 steps): announced, with the one it replaces
    guard.saver.stall_s = 0.08
    assert not guard.periodic_due(140) and guard.periodic_due(141)
    second = announced(tmp_path)[-1]
    assert second["message"].startswith("checkpoint every 41 steps (0.41 s), was 20 (0.2 s): "
                                        "a save pauses training 0.08 s (measured)"), second  # fmt: skip
    assert (second["data"]["every_steps"], second["data"]["was_steps"]) == (41, 20)
    # slower steps: 41 steps of 13 ms are 0.53 s, more than a quarter past the 0.41 s announced
    # (the optimum, 31.4 steps, is still within a quarter of 41): announced again
    guard.schedule.step_time_s = 0.013
    assert guard.periodic_due(131) and len(announced(tmp_path)) == 3
    third = announced(tmp_path)[-1]["data"]
    assert (third["every_steps"], third["was_steps"]) == (31, 41), third
    # before any save the stall is a guess from the state's size, and says so; the rate that
    # was the setting is named as the setting
    other = tmp_path / "other"
    guard, _ = make_guard(run_dir=other, auto=True, preemptions_per_hour=2.0)
    guard.schedule.step_time_s, guard.saver.stall_s, guard.saver.last_step = 1.0, None, 0
    guard.periodic_due(1)
    said = announced(other)[-1]["message"]
    assert "(guessed from the model's size until a save is measured)" in said, said
    assert "2 preemptions with one (your setting checkpoint.preemptions_per_hour)" in said, said


def test_an_interval_of_the_runs_own_is_announced_once_in_steps_and_seconds(
    make_guard: Any, tmp_path: Path
) -> None:
    guard, trainer = make_guard(every_steps=4)
    for s in range(1, 6):
        boundary(guard, trainer, s)
    guard.saver.wait()
    said = announced(tmp_path)
    assert len(said) == 1 and said[0]["data"]["rule"] == "every_steps", said
    assert said[0]["data"]["every_steps"] == 4 and said[0]["data"]["step"] == 2  # step 1: untimed
    assert said[0]["message"].startswith("checkpoint every 4 steps ("), said
    assert "checkpoint.every_steps, set for this run" in said[0]["message"]


class BlockedWriter(dcpwriter.HashingWriter):
    """tgnb's DCP file writer, held at its first write until `gate` opens (a slow disk, made slow on
    purpose so the test can see training go on while the save is in flight)."""

    gate = threading.Event()

    def write_data(self, plan: Any, planner: Any) -> Any:
        assert self.gate.wait(60)
        return super().write_data(plan, planner)


def test_async_save_is_staged_then_written_while_training_goes_on_and_sigterm_waits_for_it(
    make_guard: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dcpwriter, "HashingWriter", BlockedWriter)
    BlockedWriter.gate.clear()
    guard, trainer = make_guard(every_steps=2)
    boundary(guard, trainer, 1)
    boundary(guard, trainer, 2)  # periodic: staged, returns while the write is held
    assert guard.saver.busy and ck.latest_complete(tmp_path / "checkpoints") is None
    staged = trainer.model[0].weight.detach().clone()
    with torch.no_grad():  # training goes on and changes the weights in place
        trainer.model[0].weight.add_(1.0)
    guard.stops.request("signal")
    threading.Timer(0.3, BlockedWriter.gate.set).start()
    assert boundary(guard, trainer, 3).should_training_stop  # waits for step 2, then saves 3
    saved = [(e["data"]["step"], e["data"]["trigger"]) for e in events(tmp_path, "CheckpointSaved")]
    assert saved == [(2, "periodic"), (3, "signal")]
    fresh = make_trainer()
    dcpio.load(tmp_path / "checkpoints" / "checkpoint-2", fresh, adapter_only=False)
    assert torch.equal(fresh.model[0].weight, staged)  # the staged snapshot, not the later weights
    dcpio.load(tmp_path / "checkpoints" / "checkpoint-3", fresh, adapter_only=False)
    assert torch.equal(fresh.model[0].weight, trainer.model[0].weight)
    assert guard.finish(trainer) == EXIT_PREEMPTED


def test_resume_loads_model_optimizer_scheduler_and_rng(make_guard: Any, tmp_path: Path) -> None:
    guard, trainer = make_guard()
    for _ in range(4):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    torch.manual_seed(1234)
    guard.stops.request()
    boundary(guard, trainer, 5)
    expected_draw = torch.rand(3)
    guard.finish(trainer)
    again, fresh = make_guard()
    assert again.resume_from() == str(tmp_path / "checkpoints" / "checkpoint-5")
    callback = GuardCallback(again)
    callback.on_train_begin(ARGS, SimpleNamespace(global_step=5), None)
    callback.on_epoch_begin(ARGS, SimpleNamespace(global_step=5), None)
    for a, b in zip(fresh.model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)
    s1, s2 = fresh.optimizer.state_dict(), trainer.optimizer.state_dict()
    assert torch.equal(s1["state"][0]["exp_avg_sq"], s2["state"][0]["exp_avg_sq"])
    assert s1["param_groups"][0]["betas"] == s2["param_groups"][0]["betas"]
    assert fresh.lr_scheduler.state_dict() == trainer.lr_scheduler.state_dict()
    assert torch.equal(torch.rand(3), expected_draw)
    assert events(tmp_path, "RunResumed")[-1]["data"]["step"] == 5


def test_corrupt_checkpoints_are_reported_moved_aside_and_then_refused(
    make_guard: Any, tmp_path: Path
) -> None:
    guard, trainer = make_guard(every_steps=1, keep_last=3, async_save=False)
    for s in (1, 2):
        boundary(guard, trainer, s)
    guard.finish(trainer)
    shard = tmp_path / "checkpoints" / "checkpoint-2" / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    again, _ = make_guard()
    assert again.resume_from() == str(tmp_path / "checkpoints" / "checkpoint-1")
    rejected = events(tmp_path, "CheckpointRejected")[-1]["data"]
    assert rejected["cause"] == "dcp/__0_0.distcp: checksum mismatch (damaged)"
    assert (Path(rejected["moved_to"]) / "dcp" / "__0_0.distcp").read_bytes() == bytes(data)
    (tmp_path / "checkpoints" / "checkpoint-1" / ck.MARKER).unlink()  # every one torn now
    third, _ = make_guard()
    with pytest.raises(CheckpointError, match="allow_fresh_start"):
        third.resume_from()
    fourth, _ = make_guard(allow_fresh_start=True)
    assert fourth.resume_from() is None


def test_a_save_that_never_finished_is_set_aside_and_the_run_starts_afresh(
    make_guard: Any, tmp_path: Path
) -> None:
    """A kill during a run's first save leaves a checkpoint directory with no marker: it never
    was a checkpoint, so the run starts again from step 0 (it failed at every restart with "no
    complete checkpoint is left"), now and at the next restart; a damaged sealed one still
    refuses that (the test above)."""
    guard, trainer = make_guard(every_steps=1, async_save=False)
    boundary(guard, trainer, 1)
    guard.finish(trainer)
    (tmp_path / "checkpoints" / "checkpoint-1" / ck.MARKER).unlink()  # the save never finished
    for _ in range(2):
        again, _ = make_guard()
        assert again.resume_from() is None
    (moved,) = (tmp_path / "checkpoints" / ck.QUARANTINE).iterdir()
    assert (moved / "REASON.txt").read_text().strip() == ck.UNFINISHED


def test_a_full_disk_keeps_the_last_checkpoint_and_names_the_disk(
    make_guard: Any, small_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    guard, trainer = make_guard(small_disk, every_steps=1, keep_last=2)
    trainer.model.add_module("big", torch.nn.Linear(300, 300))  # about 360 kB a copy
    trainer.optimizer.add_param_group({"params": list(trainer.model.big.parameters())})
    trainer.model.big(torch.randn(1, 300)).sum().backward()
    trainer.optimizer.step()
    stopped_at = None
    for s in range(1, 10):
        if boundary(guard, trainer, s).should_training_stop:
            stopped_at = s
            break
    assert stopped_at is not None, "the small disk never filled up"
    assert guard.finish(trainer) == Exit.NO_SPACE
    latest = ck.latest_complete(small_disk / "checkpoints")
    assert latest is not None and latest.step >= 1
    err = capfd.readouterr().err
    assert f"disk full on {small_disk / 'checkpoints'}" in err
    assert ck.checkpoint_dirs(small_disk / "checkpoints")[0].name == latest.name


def test_another_world_size_keeps_the_global_batch(make_guard: Any, tmp_path: Path) -> None:
    from tgnb.errors import TrainConfigError

    path = tmp_path / "checkpoints" / "checkpoint-6"
    path.mkdir(parents=True)
    (path / "optimizer.json").write_text("{}")
    ck.write_marker(path, 6, world_size=4, global_batch=32, samples=192)
    guard, _ = make_guard()
    kwargs = {"per_device_train_batch_size": 8}
    assert batch_args(guard.ckpt_dir, kwargs, 4) == kwargs  # the same world size: nothing changes
    assert batch_args(guard.ckpt_dir, kwargs, 2)["gradient_accumulation_steps"] == 2
    assert batch_args(guard.ckpt_dir, kwargs, 1)["gradient_accumulation_steps"] == 4
    # the same world size with another per-device batch: the global batch is kept too
    assert (
        batch_args(guard.ckpt_dir, {"per_device_train_batch_size": 4}, 4)[
            "gradient_accumulation_steps"
        ]
        == 2
    )
    with pytest.raises(TrainConfigError, match="per_device_train_batch_size"):
        batch_args(guard.ckpt_dir, {"per_device_train_batch_size": 3}, 2)


def test_every_file_of_a_checkpoint_is_digested_by_exactly_one_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`own_files`: a rank's DCP shards and RNG file are its own (rank 10 is not rank 1's), the
    rest (JSON, DCP's .metadata) rank 0's."""
    names = ["rng-0.safetensors", "rng-1.safetensors", "rng-10.safetensors", "optimizer.json"]
    names += ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/__1_1.distcp"]
    names += ["dcp/__10_0.distcp"]
    for n in names:
        (tmp_path / n).parent.mkdir(exist_ok=True)
        (tmp_path / n).write_bytes(b"x")
    owned = {}
    for r in (0, 1, 10):
        monkeypatch.setenv("RANK", str(r))
        owned[r] = dcpio.own_files(tmp_path)
    assert owned[1] == ["dcp/__1_0.distcp", "dcp/__1_1.distcp", "rng-1.safetensors"]
    assert owned[10] == ["dcp/__10_0.distcp", "rng-10.safetensors"]
    assert sorted(owned[0] + owned[1] + owned[10]) == sorted(names)


def test_the_shards_are_checksummed_as_written_not_read_back(
    make_guard: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each byte of a DCP shard is written once: the manifest's entries for DCP's files (the
    metadata under its final name included) come from the writer's stream, the small files
    tgnb writes itself are the only ones digested by reading; and the entries are the files'
    true checksums (read back here, by the test)."""
    read_back: list[str] = []
    real_digest = ck.digest

    def watched(path: Path, rels: list[str]) -> list[ck.FileEntry]:
        read_back.extend(rels)
        return real_digest(path, rels)

    monkeypatch.setattr(ck, "digest", watched)
    guard, trainer = make_guard(every_steps=1, async_save=False)
    boundary(guard, trainer, 1)
    ckpt = ck.latest_complete(tmp_path / "checkpoints")
    assert ckpt is not None
    shards = {e.path for e in ckpt.files if e.path.startswith(f"{dcpio.STATE_DIR}/")}
    assert f"{dcpio.STATE_DIR}/.metadata" in shards and len(shards) >= 2
    assert read_back and not any(r.startswith(f"{dcpio.STATE_DIR}/") for r in read_back)
    on_disk = {e.path: e for e in real_digest(ckpt.path, sorted(shards))}
    assert {e.path: e for e in ckpt.files if e.path in shards} == on_disk
