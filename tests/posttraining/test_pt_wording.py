"""Limits from the model and fixes in the user's own words (issue 23 §4).

A real IPython shell and a real emulator daemon: the LoRA rank check says the model's own range
(``pt.models()`` lists 64 for the tiny model; before: "1 to 512", and ``--rank -1`` said ">= 0" while
0 is refused too); ``%tg pt`` errors name ``%tg pt`` fixes, not Python calls; a training checkpoint's
download is refused as the SDK documents (its ``download_checkpoint`` takes "the inference
checkpoint to download").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import together
from IPython.core.error import UsageError
from together.post_training import download_checkpoint

from tgnb.emulator.testing import EmulatorHandle
from tgnb.notebook._wording import as_pt_magic


@pytest.fixture
def pt(ip: Any, rl_emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("TGNB_HOME", str(rl_emulator.home))
    magics = ip.magics_manager.registry["Tg"]
    magics._pt = None
    yield magics
    magics._pt = None


def test_python_fixes_become_magic_lines() -> None:
    said = as_pt_magic(
        "resource r1 still has 1 active session(s) (m1): stop them first, or res.stop(force=True)"
    )
    assert said.endswith("or %tg pt stop --force")
    assert "--rank 8" in as_pt_magic("LoRA rank must be a whole number, got 'x': try rank=8")
    assert "%tg pt start MODEL --generators 1" in as_pt_magic(
        "no generator: start one with pt.start(..., generators=1)"
    )
    assert "%tg pt checkpoints" in as_pt_magic("res.checkpoints() lists training checkpoints")


@pytest.mark.slow
def test_rank_range_and_magic_fixes(
    ip: Any, pt: Any, rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    import tgnb

    models = tgnb.post_training(local=True, home=rl_emulator.home).models()
    assert models[0].max_lora_rank == 64
    ip.run_line_magic("tg", "pt start tgnb/tiny-llama --generators 0 -o res")
    res = ip.user_ns["res"]
    try:
        for rank in ("65", "-1", "0"):
            with pytest.raises(UsageError, match=r"LoRA rank -?\d+ is out of range: use 1 to 64"):
                ip.run_line_magic("tg", f"pt open --rank {rank}")
        ip.run_line_magic("tg", "pt open --rank 64 --name wide -o s")
        with pytest.raises(UsageError) as err:
            ip.run_line_magic("tg", "pt stop")
        assert "%tg pt stop --force" in str(err.value) and "res.stop" not in str(err.value)

        sess = ip.user_ns["s"]
        ck = sess.save("training")
        client = rl_emulator.client(max_retries=0)
        with pytest.raises(together.BadRequestError, match="only inference checkpoints download"):
            download_checkpoint(client, ck.id, variant="CHECKPOINT_VARIANT_ADAPTER",
                                output_dir=str(tmp_path / "t"))  # fmt: skip
        inf = sess.save("inference")
        files = download_checkpoint(
            client, inf.id, variant="CHECKPOINT_VARIANT_ADAPTER", output_dir=str(tmp_path / "i")
        )
        assert sorted(p.name for p in files) == ["adapter_config.json", "adapter_model.safetensors"]
    finally:
        res.stop(force=True)
