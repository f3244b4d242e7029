"""The engine of a Model Resource: sessions as peft named adapters over one base, training that
touches only the session's adapter, publishing, sampling, LoRA limits, full weight, memory.

Real computation throughout: the built-in tiny Llama, peft LoRA, torch on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tgnb.emulator.rl.catalog import resolve
from tgnb.emulator.rl.engine import ResourceAtCapacity, ResourceHost, RLInputError


@pytest.fixture(autouse=True)
def private_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = tmp_path_factory.getbasetemp() / "engine-caches"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("TGNB_HOME", str(root / "tgnb"))
        yield


def new_host(lora: bool = True) -> ResourceHost:
    return ResourceHost(resolve("tgnb/tiny-llama"), lora_enabled=lora, device="cpu")


def mi(tokens: list[int]) -> dict[str, Any]:
    return {"chunks": [{"encoded_text": {"tokens": tokens}}]}


def ce_batch(host: ResourceHost, texts: list[str]) -> list[dict[str, Any]]:
    out = []
    for text in texts:
        t = host.tokenizer.encode(text, add_special_tokens=False)
        out.append(
            {
                "model_input": mi(t[:-1]),
                "loss_fn_inputs": {
                    "target_tokens": {"data": t[1:], "dtype": "int64"},
                    "weights": {"data": [1.0] * (len(t) - 1), "dtype": "float32"},
                },
            }
        )
    return out


def train_step(host: ResourceHost, sid: str, lr: float = 0.05) -> None:
    batch = ce_batch(host, ["12+7=19", "3*4=12", "hello world"])
    host.forward_backward(sid, {"loss": {"type": "cross_entropy"}, "samples": batch})
    host.optim_step(sid, {"adam_params": {"learning_rate": lr}})


def snapshot(host: ResourceHost) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in host.model.named_parameters()}


def changed(before: dict[str, torch.Tensor], host: ResourceHost) -> set[str]:
    now = dict(host.model.named_parameters())
    return {n for n, t in before.items() if not torch.equal(t, now[n])}


def greedy(host: ResourceHost, sid: str, prompt: str = "12+7=", **extra: Any) -> dict[str, Any]:
    body = {
        "model_inputs": [mi(host.tokenizer.encode(prompt, add_special_tokens=False))],
        "sampling_params": {"max_tokens": 6, "temperature": 0.0},
        "prompt_logprobs": True,
        **extra,
    }
    return host.sample(sid, body)["results"][0]


def test_sessions_train_only_their_own_adapter_and_publish_on_sync() -> None:
    host = new_host()
    host.open_session("a", {"rank": 4, "alpha": 8, "seed": 1})
    host.open_session("b", {"rank": 8, "alpha": 16, "seed": 2, "train_unembed": False})
    before = snapshot(host)
    sampled = greedy(host, "a")
    train_step(host, "a")
    moved = changed(before, host)
    assert moved and all(".s1." in n for n in moved), sorted(moved)[:5]  # a's trainer adapter only
    assert host.optim_step("a", {}) == {"step": "2"} and host.step("a") == 2
    state = host.policy_state("a")
    assert state == {"applied_weights_version": 0, "target_weights_version": 2, "trainer_step": 2,
                     "pending_publish": True}  # fmt: skip
    assert greedy(host, "a") == sampled  # optim-step does not change what sampling sees
    assert host.weights_sync("a", {"weight_sync_type": "WEIGHT_SYNC_TYPE_SYNCHRONOUS"}) == {
        "weights_version": 2
    }
    after_sync = greedy(host, "a")
    assert after_sync["prompt_logprobs"] != sampled["prompt_logprobs"]
    assert after_sync["policy_segments"] == [{"start_token": 0, "version": 2}]
    moved = changed(before, host)
    assert all(".s1." in n or ".s1_pub." in n for n in moved)  # base and b untouched
    assert greedy(host, "b")["policy_segments"] == [{"start_token": 0, "version": 0}]
    host.close_session("a")
    with pytest.raises(RLInputError):
        host.step("a")
    train_step(host, "b")  # b keeps working after a's adapters are gone
    assert host.step("b") == 1


def test_lora_limits_and_capacity() -> None:
    host = new_host()
    for rank in (0, 65, "8", 2.5):
        with pytest.raises(RLInputError) as err:
            host.open_session("x", {"rank": rank})
        assert err.value.field == "lora_config.rank"
    with pytest.raises(RLInputError) as err:
        host.open_session("x", {"rank": 4, "shape": 2})
    assert err.value.field == "lora_config.shape"
    assert not host.sessions
    for i in range(5):
        host.open_session(f"s{i}", {"rank": 2})
    with pytest.raises(ResourceAtCapacity):
        host.open_session("s5", {"rank": 2})
    host.close_session("s0")
    host.open_session("s5", None)  # defaults: rank 32, alpha 32
    assert host.sessions["s5"].lora == {"rank": 32, "alpha": 32, "dropout": 0.0, "seed": None,
                                        "train_unembed": True}  # fmt: skip


def test_memory_of_five_lora_sessions_is_well_under_five_times_one() -> None:
    """memory_bytes counts every distinct tensor storage: parameters, gradients, buffers and
    optimizer state. Five sessions share one base, so they add only adapters and Adam state."""
    host = new_host()
    host.open_session("s0", {"rank": 8})
    train_step(host, "s0")
    one = host.memory_bytes()
    for i in range(1, 5):
        host.open_session(f"s{i}", {"rank": 8})
        train_step(host, f"s{i}")
    five = host.memory_bytes()
    shared = one - per_session(host, "s0")
    # each extra session costs exactly its own adapters + Adam state; the base is held once
    assert five == shared + sum(per_session(host, f"s{i}") for i in range(5))
    base = [p for n, p in host.base.named_parameters() if "lora_" not in n]
    assert shared >= sum(p.numel() * p.element_size() for p in base)
    assert five < 0.6 * 5 * one, (five, one)  # tiny model, rank 8: about 2.8x (adapters ~ base)


def per_session(host: ResourceHost, sid: str) -> int:
    sess = host.sessions[sid]
    tensors = [t for pair in sess.pairs for t in pair] + sess.optimizer.state_tensors()
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_full_weight_trains_a_copy_and_publishes_on_sync() -> None:
    host = new_host(lora=False)
    with pytest.raises(RLInputError):
        host.open_session("f", {"rank": 8})
    host.open_session("f", None)
    with pytest.raises(ResourceAtCapacity):
        host.open_session("g", None)
    first = greedy(host, "f")
    train_step(host, "f", lr=0.01)
    assert greedy(host, "f") == first
    host.weights_sync("f", {})
    assert greedy(host, "f")["prompt_logprobs"] != first["prompt_logprobs"]
    host.close_session("f")
    host.open_session("g", None)  # a new full-weight session starts from the base again
    assert greedy(host, "g") == first


def test_sampling_seed_stop_logprobs_and_batching() -> None:
    host = new_host()
    host.open_session("s", {"rank": 4, "seed": 0})
    tok = host.tokenizer
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+7=", "a longer prompt: ")]
    body: dict[str, Any] = {
        "model_inputs": [mi(p) for p in prompts],
        "num_samples": 3,
        "sampling_params": {
            "max_tokens": 12,
            "temperature": 1.0,
            "seed": 7,
            "top_k": 40,
            "top_p": 0.95,
        },
        "prompt_logprobs": True,
        "topk_prompt_logprobs": 3,
    }
    a, b = host.sample("s", body), host.sample("s", body)
    assert a == b  # same seed, same output
    body["sampling_params"]["seed"] = 8
    assert host.sample("s", body) != a
    res = a["results"]
    assert len(res) == 2 and all(len(r["sequences"]) == 3 for r in res)
    for r, p in zip(res, prompts, strict=True):
        assert len(r["prompt_logprobs"]) == len(p) and r["prompt_logprobs"][0] == 0.0
        assert r["topk_prompt_logprobs"][0] == {"token_ids": [], "logprobs": []}
        assert all(len(e["token_ids"]) == 3 for e in r["topk_prompt_logprobs"][1:])
        for s in r["sequences"]:
            assert 1 <= len(s["tokens"]) <= 12 and all(isinstance(t, str) for t in s["tokens"])
            assert len(s["logprobs"]) == len(s["tokens"])
            # on-policy: the sampler's logprobs equal a forward pass over the same tokens
            full = p + [int(t) for t in s["tokens"]]
            fwd = host.forward_backward("s", {
                "loss": {"type": "cross_entropy"}, "forward_only": True, "return_loss_fn_outputs": True,
                "samples": [{"model_input": mi(full[:-1]), "loss_fn_inputs": {
                    "target_tokens": {"data": full[1:], "dtype": "int64"},
                    "weights": {"data": [1.0] * (len(full) - 1), "dtype": "float32"}}}]})  # fmt: skip
            data = fwd["loss_fn_outputs"][0]["tensors"]["logprobs"]["data"]
            assert data[len(p) - 1 :] == pytest.approx(s["logprobs"], abs=1e-4)
            assert data[: len(p) - 1] == pytest.approx(r["prompt_logprobs"][1:], abs=1e-4)
    # greedy == top_k 1; a stop string ends the row with the string kept in the tokens
    g = greedy(host, "s", sampling_params={"max_tokens": 6, "temperature": 0.0})
    k1 = greedy(
        host, "s", sampling_params={"max_tokens": 6, "temperature": 1.0, "top_k": 1, "seed": 3}
    )
    assert g["sequences"][0]["tokens"] == k1["sequences"][0]["tokens"]
    text = tok.decode([int(t) for t in g["sequences"][0]["tokens"]])
    stop = text[2:4]
    cut = greedy(host, "s", sampling_params={"max_tokens": 6, "temperature": 0.0, "stop": [stop]})
    seq = cut["sequences"][0]
    assert seq["stop_reason"] == "STOP_REASON_STOP" and tok.decode(
        [int(t) for t in seq["tokens"]]
    ).endswith(stop)
    assert (
        g["sequences"][0]["stop_reason"] == "STOP_REASON_LENGTH"
        or len(g["sequences"][0]["tokens"]) < 6
    )
    for bad_params, field in (({"top_p": 0}, "sampling_params.top_p"), ({"temperature": -1}, "sampling_params.temperature"),
                              ({"max_tokens": 0}, "sampling_params.max_tokens")):  # fmt: skip
        with pytest.raises(RLInputError) as err:
            host.sample("s", {"model_inputs": [mi(prompts[0])], "sampling_params": bad_params})
        assert err.value.field == field
    with pytest.raises(RLInputError) as err:
        host.sample("s", {"model_inputs": [mi(prompts[0])], "topk_prompt_logprobs": 21})
    assert err.value.field == "topk_prompt_logprobs"


def test_optim_params_and_muon() -> None:
    from tgnb.emulator.rl import optim

    assert optim.parse({})[3] == 1.0  # unset grad_clip_norm clips at 1.0
    assert optim.parse({"adam_params": {"grad_clip_norm": 0}})[3] == 0.0  # 0 is off
    with pytest.raises(RLInputError) as err:
        optim.parse({"adam_params": {"learning_rate": "fast"}})
    assert err.value.field == "adam_params.learning_rate"
    host = new_host()
    host.open_session("m", {"rank": 4})
    before = snapshot(host)
    batch = ce_batch(host, ["12+7=19"])
    host.forward_backward("m", {"loss": {"type": "cross_entropy"}, "samples": batch})
    assert host.optim_step("m", {"muon_params": {"learning_rate": 0.02}}) == {"step": "1"}
    assert changed(before, host)
    with pytest.raises(RLInputError) as err:
        host.optim_step("m", {"adam_params": {}})
    assert err.value.field == "adam_params"


def test_grad_clip_norm_bounds_the_applied_gradient() -> None:
    """Adam is nearly blind to a gradient's scale, so the clip itself is observed: the gradient
    the optimizer steps with has norm grad_clip_norm; 0 does not clip."""
    host = new_host()
    host.open_session("c", {"rank": 4})
    seen: list[float] = []
    original = torch.nn.utils.clip_grad_norm_

    def spy(params: Any, max_norm: float, *a: Any, **k: Any) -> torch.Tensor:
        params = list(params)
        total = original(params, max_norm, *a, **k)
        seen.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))))
        return total

    torch.nn.utils.clip_grad_norm_ = spy  # type: ignore[assignment]
    try:
        batch = ce_batch(host, ["12+7=19", "hello world"])
        host.forward_backward("c", {"loss": {"type": "cross_entropy"}, "samples": batch})
        host.optim_step("c", {"adam_params": {"grad_clip_norm": 0.01}})
        host.forward_backward("c", {"loss": {"type": "cross_entropy"}, "samples": batch})
        host.optim_step("c", {"adam_params": {"grad_clip_norm": 0}})
    finally:
        torch.nn.utils.clip_grad_norm_ = original  # type: ignore[assignment]
    assert len(seen) == 1 and seen[0] == pytest.approx(0.01, rel=1e-3)


def test_a_local_causal_lm_directory_is_a_base_model(tmp_path: Path) -> None:
    """A GPT-2 (Conv1D layers, untied head) saved to a directory: resolved by its path, trained
    with LoRA, sampled, and exported merged."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from tgnb.emulator.rl.engine import export_checkpoint
    from tgnb.tasks.assets import build_tokenizer

    tok = build_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                        tie_word_embeddings=False, eos_token_id=tok.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    spec = resolve(str(tmp_path / "gpt2"))
    assert spec.name == str(tmp_path / "gpt2") and spec.context_length == 64
    host = ResourceHost(spec, lora_enabled=True, device="cpu")
    host.open_session("s", {"rank": 4, "train_unembed": False})
    train_step(host, "s", lr=0.05)
    host.weights_sync("s", {})
    res = greedy(host, "s")
    assert len(res["sequences"][0]["tokens"]) >= 1
    host.save_inference_checkpoint("s", tmp_path / "inf")
    export_checkpoint(tmp_path / "inf", "CHECKPOINT_VARIANT_MERGED", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    prompt = torch.tensor([tok.encode("12+7=", add_special_tokens=False)])
    with torch.no_grad():
        lsm = torch.log_softmax(merged(input_ids=prompt).logits[0, :-1], -1)
    want = lsm.gather(-1, prompt[0, 1:, None]).squeeze(-1).tolist()
    assert res["prompt_logprobs"][1:] == pytest.approx(want, abs=1e-5)
