"""The Post-Training catalog: the built-in model in the local HF cache in the hub's layout, listed
by its snapshot directory and also accepted as ``tgnb/tiny-llama`` (its tokenizer loads by that
name offline, in a fresh process), local directories, the supported-models body."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tgnb.emulator.rl import catalog
from tgnb.emulator.rl.engine import RLInputError


@pytest.fixture(autouse=True)
def private_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("TGNB_HOME", str(tmp_path / "tgnb"))
    monkeypatch.delenv(catalog.EXTRA_ENV, raising=False)
    yield tmp_path / "hf"


def test_tiny_tokenizer_loads_by_name_offline_in_a_fresh_process(private_caches: Path) -> None:
    snapshot = catalog.materialize_tiny()
    assert snapshot.is_relative_to(private_caches / "hub" / "models--tgnb--tiny-llama")
    assert catalog.materialize_tiny() == snapshot  # idempotent
    script = (
        "from transformers import AutoTokenizer, AutoConfig;"
        "t = AutoTokenizer.from_pretrained('tgnb/tiny-llama');"
        "c = AutoConfig.from_pretrained('tgnb/tiny-llama');"
        "print(t.encode('12+7=', add_special_tokens=False), t.eos_token, c.model_type)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HOME=str(private_caches), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from tgnb.tasks.assets import build_tokenizer

    expected = build_tokenizer().encode("12+7=", add_special_tokens=False)
    assert done.stdout.strip() == f"{expected} </s> llama"


def test_resolve_builtin_local_dir_and_unknown(tmp_path: Path) -> None:
    spec = catalog.resolve(catalog.TINY_NAME)
    assert spec.name == catalog.TINY_NAME and spec.context_length == 2048
    assert (Path(spec.path) / "config.json").is_file()
    local = catalog.resolve(spec.path)  # a local HF directory is its own name
    assert local.name == spec.path and local.path == spec.path
    with pytest.raises(RLInputError) as err:
        catalog.resolve("meta-llama/Not-Here-8B")
    assert err.value.field == "base_model" and "tgnb/tiny-llama" in str(err.value)
    with pytest.raises(RLInputError):
        catalog.resolve(str(tmp_path / "missing-dir"))


def test_listed_name_is_the_snapshot_directory_and_the_alias_is_the_same_model(
    tmp_path: Path,
) -> None:
    listed = catalog.supported_models()[0]
    assert listed.name == listed.path == str(catalog.materialize_tiny())
    assert catalog.resolve(listed.name) == listed  # the listed name resolves as itself
    assert catalog.resolve(catalog.TINY_NAME).path == listed.path
    assert catalog.same_model(catalog.TINY_NAME, listed.name)
    assert catalog.same_model(listed.name, listed.name)
    from tgnb.tasks import assets

    other = assets.tiny_path(seed=1)
    assert not catalog.same_model(catalog.TINY_NAME, str(other))
    assert not catalog.same_model(catalog.TINY_NAME, str(tmp_path / "gone"))


def test_supported_models_body_parses_with_the_sdk_types(monkeypatch: pytest.MonkeyPatch) -> None:
    from together.types.post_training.rl_supported_models import RlSupportedModels

    from tgnb.tasks import assets

    extra = str(assets.tiny_path())
    builtin = str(catalog.materialize_tiny())
    monkeypatch.setenv(catalog.EXTRA_ENV, os.pathsep.join([extra, builtin]))
    body = catalog.supported_models_to_api()
    parsed = RlSupportedModels.model_validate(body)
    names = [m.base_model for m in parsed.data]
    assert names == [builtin, extra]  # the built-in model first, listed once
    config = parsed.data[0].compute_configs[0]  # type: ignore[index]
    assert config.trainer_config.lora.max_rank == catalog.DEFAULT_MAX_LORA_RANK  # type: ignore[union-attr]
    assert config.generator_config.context_length == 2048  # type: ignore[union-attr]
