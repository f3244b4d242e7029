"""Checkpoints of the engine: training state (adapter + optimizer, safetensors + JSON, no pickle)
resumes exactly; inference checkpoints export as a peft adapter and as merged weights that load
with peft / transformers and reproduce the engine's logprobs. Real torch/peft on the CPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tgnb.emulator.rl.catalog import resolve
from tgnb.emulator.rl.engine import ResourceHost, RLInputError, export_checkpoint

TEXTS = ["12+7=19", "3*4=12", "hello world"]


@pytest.fixture(autouse=True)
def private_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = tmp_path_factory.getbasetemp() / "engine-caches"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("TGNB_HOME", str(root / "tgnb"))
        yield


def mi(tokens: list[int]) -> dict[str, Any]:
    return {"chunks": [{"encoded_text": {"tokens": tokens}}]}


def batch(host: ResourceHost) -> list[dict[str, Any]]:
    out = []
    for text in TEXTS:
        t = host.tokenizer.encode(text, add_special_tokens=False)
        w = {"data": [1.0] * (len(t) - 1), "dtype": "float32"}
        out.append({"model_input": mi(t[:-1]), "loss_fn_inputs": {
            "target_tokens": {"data": t[1:], "dtype": "int64"}, "weights": w}})  # fmt: skip
    return out


def step(host: ResourceHost, sid: str, optimizer: str = "adam") -> None:
    host.forward_backward(sid, {"loss": {"type": "cross_entropy"}, "samples": batch(host)})
    key = "adam_params" if optimizer == "adam" else "muon_params"
    host.optim_step(sid, {key: {"learning_rate": 0.02}})


def logprobs(host: ResourceHost, sid: str) -> list[float]:
    out = host.forward_backward(sid, {"loss": {"type": "cross_entropy"}, "samples": batch(host),
                                      "forward_only": True, "return_loss_fn_outputs": True})  # fmt: skip
    return [x for o in out["loss_fn_outputs"] for x in o["tensors"]["logprobs"]["data"]]


def published_logprobs(host: ResourceHost, sid: str) -> list[float]:
    """The published weights' logprobs of TEXTS, through the sample operation's prompt logprobs."""
    prompts = [host.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    res = host.sample(sid, {"model_inputs": [mi(p) for p in prompts], "prompt_logprobs": True,
                            "sampling_params": {"max_tokens": 1}})  # fmt: skip
    return [x for r in res["results"] for x in r["prompt_logprobs"][1:]]


def hf_logprobs(model: Any, host: ResourceHost) -> list[float]:
    out: list[float] = []
    with torch.no_grad():
        for text in TEXTS:
            t = torch.tensor([host.tokenizer.encode(text, add_special_tokens=False)])
            lsm = torch.log_softmax(model(input_ids=t).logits.float(), -1)
            out.extend(lsm[0, :-1].gather(-1, t[0, 1:, None]).squeeze(-1).tolist())
    return out


@pytest.mark.parametrize("optimizer", ["adam", "muon"])
def test_training_checkpoint_resumes_weights_step_and_optimizer(
    tmp_path: Path, optimizer: str
) -> None:
    host = ResourceHost(resolve("tgnb/tiny-llama"), lora_enabled=True, device="cpu")
    host.open_session("a", {"rank": 4, "alpha": 8, "seed": 3})
    step(host, "a", optimizer)
    step(host, "a", optimizer)
    host.save_training_checkpoint("a", tmp_path / "ck")
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert files == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "meta.json",
        "optimizer.safetensors",
    ]
    assert json.loads((tmp_path / "ck" / "meta.json").read_text())["step"] == 2
    saved = logprobs(host, "a")
    step(host, "a", optimizer)
    continued = logprobs(host, "a")
    # a new session (other seed and rank) resumes from the checkpoint, optimizer included
    host.open_session("b", {"rank": 8})
    host.load_training_checkpoint("b", tmp_path / "ck", load_optimizer=True)
    assert host.step("b") == 2 and host.policy_state("b")["applied_weights_version"] == 2
    assert logprobs(host, "b") == pytest.approx(saved, abs=1e-6)
    assert published_logprobs(host, "b") == pytest.approx(saved, abs=1e-5)  # resumed = published
    step(host, "b", optimizer)
    assert logprobs(host, "b") == pytest.approx(continued, abs=1e-5)  # same Adam/Muon state
    host.open_session("c", {"rank": 4, "alpha": 8})
    host.load_training_checkpoint("c", tmp_path / "ck", load_optimizer=False)
    assert host.sessions["c"].optimizer is None and host.step("c") == 2


def test_exports_reproduce_the_engines_logprobs(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec = resolve("tgnb/tiny-llama")
    host = ResourceHost(spec, lora_enabled=True, device="cpu")
    host.open_session("a", {"rank": 4, "alpha": 8, "seed": 1})  # train_unembed: LoRA on lm_head
    for _ in range(3):
        step(host, "a")
    host.weights_sync("a", {})
    step(host, "a")  # the trainer moves on: the inference checkpoint holds its new weights
    host.save_inference_checkpoint("a", tmp_path / "inf")
    want = logprobs(host, "a")
    assert published_logprobs(host, "a") != pytest.approx(want, abs=1e-4)

    adapter = export_checkpoint(
        tmp_path / "inf", "CHECKPOINT_VARIANT_ADAPTER", tmp_path / "adapter"
    )
    assert sorted(p.name for p in adapter) == ["adapter_config.json", "adapter_model.safetensors"]
    base = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    assert hf_logprobs(peft_model, host) == pytest.approx(want, abs=1e-5)

    merged = export_checkpoint(tmp_path / "inf", "CHECKPOINT_VARIANT_MERGED", tmp_path / "merged")
    names = {p.name for p in merged}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "merged"), dtype=torch.float32
    ).eval()
    assert hf_logprobs(model, host) == pytest.approx(want, abs=1e-5)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight

    with pytest.raises(RLInputError) as err:
        export_checkpoint(tmp_path / "inf", "CHECKPOINT_VARIANT_ZIP", tmp_path / "x")
    assert err.value.field == "variant"


def test_full_weight_checkpoints(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    host = ResourceHost(resolve("tgnb/tiny-llama"), lora_enabled=False, device="cpu")
    host.open_session("f", None)
    step(host, "f")
    host.save_training_checkpoint("f", tmp_path / "ck")
    saved = logprobs(host, "f")
    step(host, "f")
    host.weights_sync("f", {})
    host.save_inference_checkpoint("f", tmp_path / "inf")
    want = logprobs(host, "f")
    host.close_session("f")
    host.open_session("g", None)
    host.load_training_checkpoint("g", tmp_path / "ck", load_optimizer=True)
    assert logprobs(host, "g") == pytest.approx(saved, abs=1e-6) and host.step("g") == 1
    with pytest.raises(RLInputError):
        export_checkpoint(tmp_path / "inf", "CHECKPOINT_VARIANT_ADAPTER", tmp_path / "a")
    export_checkpoint(tmp_path / "inf", "CHECKPOINT_VARIANT_MERGED", tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "merged"), dtype=torch.float32
    ).eval()
    assert hf_logprobs(model, host) == pytest.approx(want, abs=1e-5)
