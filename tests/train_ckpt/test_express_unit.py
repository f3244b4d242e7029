"""The express checkpoint a preemption writes (`tgnb.train.express`): one safetensors file, written
in place into space allocated beforehand, sealed by a marker written over a blank one, and written
back out in the Trainer's layout for the resume. A real ``transformers.Trainer`` over the built-in
tiny model, with a real AdamW state after two optimizer steps; nothing is faked."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tgnb.train import checkpoint as ck
from tgnb.train import express, fastsave

ALGO = "xxh3_128"


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from tgnb.train import assets

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(assets.tiny_path(0))
    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("out")),
        use_cpu=True,
        report_to="none",
        max_steps=10,
        learning_rate=1e-3,
    )
    tr = Trainer(model=model, args=args)
    tr.create_optimizer_and_scheduler(num_training_steps=10)
    for step in (1, 2):
        ids = torch.randint(0, 10, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        tr.optimizer.step()
        tr.lr_scheduler.step()
        tr.optimizer.zero_grad()
        tr.state.global_step = step
        tr.state.log_history.append({"loss": 1.0 / step, "step": step})
    return tr


def rng() -> dict[str, Any]:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    return fastsave.capture_rng()


def seal(path: Path, step: int) -> Any:
    def make(entries: list[ck.FileEntry]) -> bytes:
        return ck.marker_record(path, step, entries, reason="signal")[1]

    return make


def renames_fail(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the spare's rename fail (a new directory's flush still works); returns the undo."""
    rename = express._rename_durable

    def fail(src: Path | None, to: Path) -> None:
        if src is not None:
            raise OSError(5, "Input/output error")
        rename(src, to)

    monkeypatch.setattr(express, "_rename_durable", fail)
    return lambda: monkeypatch.setattr(express, "_rename_durable", rename)


def assert_restores(trainer: Any, expanded: Path, states: dict[str, Any]) -> None:
    """The Trainer-layout files hold exactly the trainer's state and `states`."""
    weights = load_file(str(expanded / "model.safetensors"))
    live = fastsave.model_tensors(trainer.model)
    assert weights.keys() == live.keys()
    assert all(torch.equal(weights[k], live[k]) for k in live)
    opt = torch.load(expanded / "optimizer.pt", weights_only=True)
    want = trainer.optimizer.state_dict()
    assert opt["param_groups"] == want["param_groups"]
    assert opt["state"].keys() == want["state"].keys()
    for index, entry in want["state"].items():
        assert opt["state"][index].keys() == entry.keys()
        assert all(torch.equal(opt["state"][index][k], v) for k, v in entry.items())
    sched = torch.load(expanded / "scheduler.pt", weights_only=False)
    assert sched == trainer.lr_scheduler.state_dict()
    got = torch.load(expanded / "rng_state.pth", weights_only=False)
    assert list(got) == list(states)
    assert got["python"] == states["python"]
    assert np.array_equal(got["numpy"][1], states["numpy"][1])
    assert torch.equal(got["cpu"], states["cpu"])
    text = (expanded / "trainer_state.json").read_text()
    assert text == fastsave.trainer_state_json(trainer)


def test_a_new_express_checkpoint_is_complete_and_restores_everything(
    trainer: Any, tmp_path: Path
) -> None:
    states = rng()
    dest = tmp_path / "checkpoints" / "checkpoint-2"
    dest.parent.mkdir()
    entries = express.write(trainer, dest, states, ALGO)  # no spare: a new file
    assert sorted(os.listdir(dest)) == [express.STATE_FILE]
    ck.write_marker(dest, 2, known=entries)
    done = ck.verify(dest)  # sizes and checksums re-read from disk
    assert done is not None and [e.path for e in done.files] == [express.STATE_FILE]
    with safe_open(str(dest / express.STATE_FILE), framework="pt") as f:  # plain safetensors
        assert f.metadata() == {"format": express.FORMAT}
        assert f.get_tensor("model/model.embed_tokens.weight").shape[0] > 0
    assert express.is_express(dest)
    assert_restores(trainer, express.expand(dest, tmp_path / "expanded"), states)


def test_the_spare_is_overwritten_in_place_and_renamed_then_sealed_over_its_blank_marker(
    trainer: Any, tmp_path: Path
) -> None:
    states = rng()
    ckpts = tmp_path / "checkpoints"
    need, room = express.spare_size(trainer, states)
    assert room >= need + 64 * 1024
    spare = express.prepare_spare(ckpts, room)
    inodes = {n: os.stat(spare / n).st_ino for n in (express.STATE_FILE, ck.MARKER)}
    assert ck.read_marker(spare) is None  # a blank marker does not parse: torn until sealed
    dest = ckpts / "checkpoint-2"
    entries = express.write(trainer, dest, states, ALGO, seal=seal(dest, 2))
    assert not spare.exists()
    assert {n: os.stat(dest / n).st_ino for n in inodes} == inodes  # the same files, in place
    assert entries[0].size == room == os.stat(dest / express.STATE_FILE).st_size  # pad included
    assert os.stat(dest / ck.MARKER).st_size == ck.BLANK_MARKER_BYTES
    done = ck.verify(dest)
    assert done is not None and done.step == 2 and done.files == tuple(entries)
    assert json.loads((dest / ck.MARKER).read_text())["reason"] == "signal"
    assert_restores(trainer, express.expand(dest, tmp_path / "expanded"), states)


def test_the_spare_is_a_complete_checkpoint_once_sealed_before_its_rename(
    trainer: Any, tmp_path: Path
) -> None:
    states = rng()
    ckpts = tmp_path / "checkpoints"
    spare = express.prepare_spare(ckpts, express.spare_size(trainer, states)[1])
    dest = ckpts / "checkpoint-2"
    seen: list[Any] = []

    def durable() -> None:  # what a process killed at this instant would leave
        seen.append((ck.latest_complete(ckpts), dest.exists()))

    express.write(trainer, dest, states, ALGO, seal=seal(dest, 2), durable=durable)
    ((staged, renamed),) = seen
    assert staged is not None and staged.path == spare and staged.step == 2 and not renamed
    assert ck.latest_complete(ckpts) == ck.verify(dest) is not None and not spare.exists()


def test_a_sealed_spare_that_was_not_renamed_is_adopted_never_deleted(
    trainer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = rng()
    ckpts = tmp_path / "checkpoints"
    _, room = express.spare_size(trainer, states)
    spare = express.prepare_spare(ckpts, room)
    dest = ckpts / "checkpoint-2"
    undo = renames_fail(monkeypatch)
    with pytest.raises(OSError, match="Input/output"):
        express.write(trainer, dest, states, ALGO, seal=seal(dest, 2))
    undo()
    staged = ck.latest_complete(ckpts)
    assert staged is not None and staged.path == spare and staged.step == 2
    express.prepare_spare(ckpts, room)  # a new spare: the sealed one is renamed first
    assert ck.read_marker(spare) is None  # blank again
    assert ck.latest_complete(ckpts) == ck.verify(dest) is not None
    assert_restores(trainer, express.expand(dest, tmp_path / "expanded"), states)

    ck._remove(dest)  # and again, for the keeper's close
    undo = renames_fail(monkeypatch)
    with pytest.raises(OSError):
        express.write(trainer, dest, states, ALGO, seal=seal(dest, 2))
    undo()
    keeper = express.SpareKeeper(ckpts)
    keeper.close()
    assert not spare.exists() and ck.verify(dest) is not None


def test_adopting_a_sealed_spare_replaces_a_torn_namesake_and_yields_to_a_complete_one(
    trainer: Any, tmp_path: Path
) -> None:
    states = rng()
    ckpts = tmp_path / "checkpoints"
    assert express.adopt_sealed(ckpts) is None  # no spare
    dest = ckpts / "checkpoint-2"
    for namesake in ("torn", "complete"):
        spare = express.prepare_spare(ckpts, express.spare_size(trainer, states)[1])
        express.write(trainer, ckpts / "staged", states, ALGO)  # unsealed, renamed...
        os.rename(ckpts / "staged", spare)  # ...back, then sealed in place
        ck.write_marker(spare, 2)
        dest.mkdir(exist_ok=True)
        if namesake == "torn":
            (dest / "model.safetensors").write_bytes(b"half")
        inode = os.stat(spare / express.STATE_FILE).st_ino
        assert express.adopt_sealed(ckpts) == dest
        assert not spare.exists() and ck.verify(dest) is not None
        kept = os.stat(dest / express.STATE_FILE).st_ino
        assert (kept == inode) == (namesake == "torn")


def test_a_state_bigger_than_the_spare_grows_the_file(trainer: Any, tmp_path: Path) -> None:
    states = rng()
    ckpts = tmp_path / "checkpoints"
    express.prepare_spare(ckpts, 4096)
    dest = ckpts / "checkpoint-2"
    entries = express.write(trainer, dest, states, ALGO)
    assert entries[0].size > 4096
    ck.write_marker(dest, 2, known=entries)
    assert ck.verify(dest) is not None
    assert_restores(trainer, express.expand(dest, tmp_path / "expanded"), states)


def test_a_tensor_safetensors_cannot_hold_is_refused_before_any_write(
    trainer: Any, tmp_path: Path
) -> None:
    ckpts = tmp_path / "checkpoints"
    spare = express.prepare_spare(ckpts, 4096)
    states = {**rng(), "cuda": torch.zeros(2, dtype=torch.complex64)}
    with pytest.raises(fastsave.Unsupported, match="complex64"):
        express.write(trainer, ckpts / "checkpoint-2", states, ALGO)
    assert sorted(p.name for p in ckpts.iterdir()) == [express.SPARE]
    assert (spare / express.STATE_FILE).read_bytes() == bytes(4096)


def test_header_names_that_need_escaping_load_back(tmp_path: Path) -> None:
    tensors = {'odd "name" \\ \t': torch.arange(6.0).reshape(2, 3), "plain.w": torch.ones(2)}
    lay = express._Layout(tensors)
    log, meta = b"log", b"meta"
    width = lay.width(100)
    path = tmp_path / "f.safetensors"
    with open(path, "wb") as fh:
        fh.write(lay.encode(len(log), len(meta), 3, width))
        for view in lay.views:
            fh.write(view)
        fh.write(log + meta + bytes(3))
    got = load_file(str(path))
    assert torch.equal(got['odd "name" \\ \t'], tensors['odd "name" \\ \t'])
    assert bytes(got[express._LOG].numpy()) == log and bytes(got[express._META].numpy()) == meta
    assert got[express._PAD].numel() == 3


def test_the_spare_keeper_allocates_in_the_background_grows_and_frees(
    trainer: Any, tmp_path: Path
) -> None:
    ckpts = tmp_path / "checkpoints"
    keeper = express.SpareKeeper(ckpts)
    states = rng()
    keeper.step_end(trainer, states, step=2)
    assert keeper.usable and keeper._thread is not None
    keeper._thread.join(timeout=60)
    room = keeper.size
    assert os.stat(ckpts / express.SPARE / express.STATE_FILE).st_size == room
    keeper.step_end(trainer, states, step=3)  # not due yet: nothing measured
    assert keeper._checked == 2
    grown = ({"loss": 0.5, "step": s, "note": os.urandom(500).hex()} for s in range(80))
    trainer.state.log_history.extend(grown)  # 80 kB more to pickle than the slack allows
    try:
        keeper.step_end(trainer, states, step=2 + keeper.CHECK_EVERY)  # due: the state grew
        assert keeper._thread is not None
        keeper._thread.join(timeout=60)
        assert keeper.size > room
        assert os.stat(ckpts / express.SPARE / express.STATE_FILE).st_size == keeper.size
    finally:
        del trainer.state.log_history[-80:]
    keeper.close()
    assert sorted(os.listdir(ckpts)) == []


def test_a_state_too_big_for_express_keeps_the_trainer_layout_and_no_spare(
    trainer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(express.SpareKeeper, "MAX_BYTES", 64 * 1024)  # the tiny state is 1.1 MB
    keeper = express.SpareKeeper(tmp_path / "checkpoints")
    keeper.step_end(trainer, rng(), step=2)
    assert not keeper.usable and keeper._thread is None
    keeper.step_end(trainer, rng(), step=2 + keeper.CHECK_EVERY)
    assert keeper._checked == 2  # not measured again
    assert keeper.plan is None
    keeper.close()
    assert not (tmp_path / "checkpoints").exists()


def test_a_marker_written_over_a_blank_one_in_place(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint-7"
    path.mkdir()
    (path / "data").write_bytes(b"x" * 100)
    (path / ck.MARKER).write_bytes(b" " * ck.BLANK_MARKER_BYTES)
    assert ck.verify(path) is None
    before = os.stat(path / ck.MARKER).st_ino
    began = time.time()
    done = ck.write_marker(path, 7)
    assert os.stat(path / ck.MARKER).st_ino == before
    assert done.time >= began and ck.verify(path) == done
    (path / ck.MARKER).write_bytes(b'{"step": 7}' + b" " * 10)  # not blank: never overwritten
    ck.write_marker(path, 7)
    assert ck.verify(path) is not None


def test_no_marker_is_written_when_a_write_fails(
    trainer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spare is sealed only after every write and the flush succeeded (here the tensors'
    write ran out of space): it stays a spare, torn if read, never listed."""
    states = rng()
    ckpts = tmp_path / "checkpoints"
    spare = express.prepare_spare(ckpts, express.spare_size(trainer, states)[1])
    dest = ckpts / "checkpoint-2"

    def full(*_args: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    with pytest.raises(OSError, match="No space"):
        express.write(trainer, dest, states, ALGO, seal=seal(dest, 2), durable=pytest.fail)
    assert ck.read_marker(spare) is None and not dest.exists()
    assert ck.checkpoint_dirs(ckpts) == []


def test_writeback_is_started_without_changing_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    data = os.urandom(300_000)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, data, 0)
        if sys.platform.startswith("linux"):
            assert express._sync_file_range is not None
        express.start_writeback(fd, 0, len(data))
        os.fdatasync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_a_guard_whose_spare_could_not_be_renamed_never_writes_into_it_again(
    trainer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's preemption snapshot seals the spare, then its rename fails: the spare holds a
    complete checkpoint, so the next save (the step boundary's) keeps the Trainer's layout, and
    closing the guard gives the sealed one its name."""
    from tgnb.train.policy import CheckpointPolicy
    from tgnb.train.preemption import CheckpointGuard
    from tgnb.train.record import Recorder

    monkeypatch.delenv("TGNB_NOTICE_FILE", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setattr(trainer, "_save_checkpoint", trainer._save_checkpoint)  # undone after
    guard = CheckpointGuard(CheckpointPolicy(keep_last=5), tmp_path, Recorder(tmp_path))
    try:
        assert guard.attach(trainer)
        keeper = guard._spare
        assert keeper is not None
        keeper.step_end(trainer, rng(), step=2)
        assert keeper._thread is not None
        keeper._thread.join()
        undo = renames_fail(monkeypatch)
        guard._boundary = (2, rng())
        with pytest.raises(OSError):
            guard._snapshot("signal")
        spare = guard.ckpt_dir / express.SPARE
        staged = ck.latest_complete(guard.ckpt_dir)
        assert staged is not None and staged.path == spare and staged.step == 2
        assert not keeper.usable
        keeper.step_end(trainer, rng(), step=2 + keeper.CHECK_EVERY)
        assert not keeper.usable  # not measured again
        guard._boundary = (3, rng())
        assert guard._snapshot("signal")
        after = ck.latest_complete(guard.ckpt_dir)
        assert after is not None and after.step == 3 and not express.is_express(after.path)
        assert ck.verify(spare) == staged  # untouched
        undo()
    finally:
        guard.close()
    assert not spare.exists()
    assert ck.verify(guard.ckpt_dir / "checkpoint-2") is not None
