"""The built-in offline assets (tiny model, character tokenizer), the built-in data sets, local
files through `datasets`, and the built-in rewards. Everything is real; nothing is downloaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tgnb.errors import TrainConfigError
from tgnb.tasks import assets, data, rewards


def test_tiny_model_is_deterministic() -> None:
    import torch

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = assets.build_model(0).state_dict()
    after = torch.rand(1)
    assert torch.equal(before, after)  # building does not disturb the caller's RNG
    b = assets.build_model(0).state_dict()
    c = assets.build_model(1).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    n = sum(t.numel() for k, t in a.items() if k != "lm_head.weight")
    assert 50_000 < n < 500_000  # tiny: hidden 64, 2 layers


def test_tokenizer_is_character_level() -> None:
    tok = assets.build_tokenizer()
    text = "What is 3+4? Answer: 7"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.pad_token == "<pad>" and tok.eos_token == "</s>"
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.convert_ids_to_tokens(tok("é", add_special_tokens=False)["input_ids"]) == ["<unk>"]
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "user: hi\nassistant:"


def test_tiny_path_is_built_once_offline(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    path = assets.tiny_path(0, home=tmp_path)
    assert path.parent == tmp_path and (path / "config.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert assets.tiny_path(0, home=tmp_path) == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary directory left
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    fresh = assets.build_model(0).state_dict()
    import torch

    assert all(torch.equal(t, fresh[k]) for k, t in model.state_dict().items())
    assert tok.decode(tok("1+2=3", add_special_tokens=False)["input_ids"]) == "1+2=3"
    assert model.config.eos_token_id == tok.eos_token_id
    assert assets.resolve_model("tiny", 0).startswith(str(assets.cache_dir()))
    assert assets.resolve_model("Qwen/Qwen2-0.5B") == "Qwen/Qwen2-0.5B"


def test_arithmetic_rows_are_seeded_and_correct() -> None:
    rows = data.arithmetic_rows(200, seed=3)
    assert rows == data.arithmetic_rows(200, seed=3)
    assert rows != data.arithmetic_rows(200, seed=4)
    for row in rows:
        a, b = (int(x) for x in row["prompt"].split("What is ")[1].split("?")[0].split("+"))
        assert row["answer"] == a + b
        assert row["prompt"].startswith("What is ")


def test_preference_rows() -> None:
    rows = data.preference_rows(100, seed=0)
    assert rows == data.preference_rows(100, seed=0)
    for row in rows:
        assert set(row) == {"prompt", "chosen", "rejected"}
        a, b = (int(x) for x in row["prompt"].split("What is ")[1].split("?")[0].split("+"))
        right = a + b
        assert rewards.parse_answer(row["chosen"]) == right
        assert rewards.parse_answer(row["rejected"]) not in (None, right)


def test_rewards() -> None:
    prompts = ["What is 1+2?"] * 5
    completions = ["3", " 3", "33", "x3", ""]
    assert rewards.correctness(prompts, completions, answer=[3] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert rewards.format_reward(prompts, completions) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert rewards.format_reward(["q"], ["7 apples"]) == [0.5]
    conversational = [[{"role": "assistant", "content": "3"}]]
    assert rewards.correctness(["q"], conversational, answer=[3]) == [1.0]
    with pytest.raises(TrainConfigError, match="needs an 'answer' column"):
        rewards.correctness(["q"], ["1"])
    assert rewards.resolve("format") is rewards.format_reward
    for func in rewards.BUILTIN.values():
        rewards.check_signature(func, func.__name__)


def test_local_files_load_through_datasets(tmp_path: Path) -> None:
    rows = data.arithmetic_rows(10)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = data.load(str(jsonl))
    assert ds.num_rows == 10 and ds[0] == rows[0]
    import pandas as pd

    parquet = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(parquet)
    ds = data.load(str(parquet))
    assert ds.num_rows == 10 and ds[3]["answer"] == rows[3]["answer"]
    built = data.load("arithmetic", seed=1, size=5)
    assert built.to_list() == data.arithmetic_rows(5, seed=1)


def test_hub_dataset_offline_is_a_config_error() -> None:
    with pytest.raises(TrainConfigError) as exc:
        data.load("tgnb-test-owner/no-such-dataset")
    msg = str(exc.value)
    assert "\n" not in msg and "could not be loaded" in msg
