"""The express checkpoint's plan (`tgnb.train.plan`): the model's and optimizer's tensors found at
a step boundary and reused by a later snapshot while they still hold. A real ``transformers.Trainer``
over the built-in tiny model, with a real AdamW state; each test builds its own, since several
change the model. Then the metadata beside the tensors (`tgnb.train.metadata`): the log history
pickled once per entry, Python's RNG state packed. Nothing is faked."""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tgnb.train import checkpoint as ck
from tgnb.train import express, fastsave, metadata
from tgnb.train import plan as planmod

ALGO = "xxh3_128"


@pytest.fixture
def watching() -> Iterator[None]:
    planmod.watch_modules()
    yield
    planmod.unwatch_modules()


def step(tr: Any, n: int) -> None:
    """One real optimizer step of `tr`'s model, as the Trainer takes it."""
    ids = torch.randint(0, 10, (2, 8))
    tr.model(input_ids=ids, labels=ids).loss.backward()
    tr.optimizer.step()
    tr.lr_scheduler.step()
    tr.optimizer.zero_grad()
    tr.state.global_step = n


@pytest.fixture
def trainer(tmp_path: Path, watching: None) -> Any:
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from tgnb.train import assets

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(assets.tiny_path(0))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=10
    )
    tr = Trainer(model=model, args=args)
    tr.create_optimizer_and_scheduler(num_training_steps=10)
    step(tr, 1)
    return tr


def written(tr: Any, path: Path, plan: Any) -> tuple[ck.FileEntry, dict[str, Any], Any]:
    """Write `tr`'s express checkpoint with `plan` to `path`; its entry, weights and state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(3)
    (entry,) = express.write(tr, path, fastsave.capture_rng(), ALGO, plan=plan)
    model, state = express.load(path)
    return entry, model, state


def assert_is_now(tr: Any, model: dict[str, Any], state: dict[str, Any]) -> None:
    live = fastsave.model_tensors(tr.model)
    assert model.keys() == live.keys()
    assert all(torch.equal(model[k], live[k]) for k in live)
    want = tr.optimizer.state_dict()
    assert state["optimizer"]["param_groups"] == want["param_groups"]
    for index, entry in want["state"].items():
        assert all(torch.equal(state["optimizer"]["state"][index][k], v) for k, v in entry.items())


def test_a_planned_checkpoint_is_byte_for_byte_the_unplanned_one(
    trainer: Any, tmp_path: Path
) -> None:
    plan = express.make_plan(trainer)
    assert plan is not None and plan.valid()
    assert len(plan.tensors) == len(fastsave.model_tensors(trainer.model)) + sum(
        len(s) for s in trainer.optimizer.state_dict()["state"].values()
    )
    with_plan, model, state = written(trainer, tmp_path / "a" / "checkpoint-1", plan)
    without, _, _ = written(trainer, tmp_path / "b" / "checkpoint-1", None)
    assert with_plan == without  # same size and checksum: the same bytes
    assert_is_now(trainer, model, state)


def test_the_plan_survives_training_steps_and_reads_the_values_at_the_snapshot(
    trainer: Any, tmp_path: Path
) -> None:
    plan = express.make_plan(trainer)
    assert plan is not None
    before = written(trainer, tmp_path / "1" / "checkpoint-1", plan)[1]
    for n in (2, 3):  # forwards slice the layers into new ModuleLists: not a change of the model
        step(trainer, n)
    assert plan.valid()
    _, model, state = written(trainer, tmp_path / "3" / "checkpoint-3", plan)
    assert_is_now(trainer, model, state)
    assert not all(torch.equal(model[k], before[k]) for k in model)  # new values, not cached ones
    assert state["optimizer"]["state"][0]["step"].item() == 3


@pytest.mark.parametrize(
    "change",
    [
        "data_swap",
        "new_parameter",
        "new_buffer",
        "new_module",
        "new_param_group",
        "optimizer_state_dropped",
    ],
)
def test_a_changed_model_or_optimizer_voids_the_plan_and_the_checkpoint_is_still_right(
    trainer: Any, tmp_path: Path, change: str
) -> None:
    plan = express.make_plan(trainer)
    assert plan is not None and plan.valid()
    model = trainer.model
    head = model.lm_head
    if change == "data_swap":
        head.weight.data = head.weight.data.clone() + 1
    elif change == "new_parameter":
        head.weight = torch.nn.Parameter(head.weight.detach().clone() + 1)
    elif change == "new_buffer":
        head.register_buffer("scale", torch.ones(3))
    elif change == "new_module":
        model.model.extra = torch.nn.Linear(2, 2)
    elif change == "new_param_group":
        trainer.optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    elif change == "optimizer_state_dropped":
        trainer.optimizer.state.pop(next(iter(trainer.optimizer.state)))
    assert not plan.valid()
    _, weights, state = written(trainer, tmp_path / "checkpoint-1", plan)
    assert_is_now(trainer, weights, state)


def test_a_cache_buffer_a_forward_reassigns_keeps_the_plan(trainer: Any) -> None:
    rotary = trainer.model.model.rotary_emb
    assert "inv_freq" in rotary._non_persistent_buffers_set
    plan = express.make_plan(trainer)
    assert plan is not None
    rotary.inv_freq = rotary.inv_freq.clone()  # not in the state dict: not the checkpoint's
    assert plan.valid()


def test_no_plan_unless_the_modules_are_watched_or_when_a_hook_renames_the_state(
    trainer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(planmod, "_HOOKS", [])  # as if nobody watched (other tests' keepers may)
        assert express.make_plan(trainer) is None  # a change could not be seen

    def rename(module: Any, state: dict[str, Any], prefix: str, local: Any) -> None:
        state[f"{prefix}renamed"] = state.pop(f"{prefix}weight")

    handle = trainer.model.model.norm._register_state_dict_hook(rename)
    try:
        assert express.make_plan(trainer) is None
    finally:
        handle.remove()
    assert express.make_plan(trainer) is not None


# -- the metadata (tgnb.train.metadata) -----------------------------------------------------------


def entries(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"loss": 1.0 / (i + 1), "step": i} for i in range(start, start + n)]


def test_the_log_history_is_pickled_once_per_entry_and_reads_back_in_order() -> None:
    history: list[dict[str, Any]] = []
    log = metadata.LogHistory()
    assert log.update(history) == []
    merged = 0
    for n in range(1, 40):
        before = len(history)
        history.extend(entries(n % 3, before))
        count = len(log.chunks)
        chunks = log.update(history)
        assert len(chunks) <= log.MERGE_AT + 1
        assert metadata.read_log(b"".join(chunks)) == history
        if len(history) == before:
            assert len(chunks) == count  # nothing new: nothing pickled
        elif len(chunks) > count:  # only the new entries were pickled
            assert pickle.loads(chunks[-1]) == history[before:]
        else:
            merged += 1
    assert merged >= 1
    first = log.chunks
    history[-1] = {"loss": 0.0, "step": -1}  # not the entry pickled last: pickled again
    assert metadata.read_log(b"".join(log.update(history))) == history
    assert log.chunks is not first and len(log.chunks) == 1
    other = list(history)  # another list: pickled again
    assert metadata.read_log(b"".join(log.update(other))) == other
    assert metadata.read_log(b"".join(log.update(other[:3]))) == other[:3]  # shorter


def test_the_python_rng_state_packs_and_unpacks_exactly() -> None:
    random.seed(7)
    state = random.getstate()
    packed = metadata.pack_rng("python", state)
    assert packed is not state and metadata.unpack_rng(pickle.loads(pickle.dumps(packed))) == state
    assert metadata.pack_rng("numpy", state) is state


def test_a_snapshot_pickles_only_the_log_entries_logged_since_the_keeper_did(
    trainer: Any, tmp_path: Path
) -> None:
    plan = express.make_plan(trainer)
    history = trainer.state.log_history
    history.extend(entries(5))
    log = metadata.LogHistory()
    express.spare_size(trainer, fastsave.capture_rng(), plan, log)  # the keeper's measure
    assert len(log.chunks) == 1
    history.extend(entries(3, 5))
    path = tmp_path / "checkpoint-1"
    express.write(trainer, path, fastsave.capture_rng(), ALGO, plan=plan, log=log)
    assert len(log.chunks) == 2 and pickle.loads(log.chunks[1]) == history[5:]
    _, state = express.load(path)
    assert state["trainer_state"].log_history == history
