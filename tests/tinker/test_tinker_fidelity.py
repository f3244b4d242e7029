"""What a Tinker script reads back, as Tinker gives it, through ``import tgnb.tinker as tinker``
against the real emulator daemon over HTTP (the unmodified ``together`` SDK underneath):

- token-id stop sequences (the cookbook's qwen3 / llama3 / deepseek / kimi / gpt_oss renderers
  stop on ids) end each sequence at its first stop token, kept as its last token, with no
  warning (pytest runs with warnings as errors: the SDK's "ignoring token-id stops" would fail);
- ``loss_fn_outputs`` hold the model's logprobs at every position, zero-weight ones included;
- the built-in model's context fits the cookbook's unmodified ``rl_loop`` (prompts of 369 tokens).
"""

from __future__ import annotations

import asyncio
import math

import pytest

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # the one line that differs from a Tinker script

types = tinker.types
MODEL = "tgnb/tiny-llama"


def test_token_id_stops_end_each_sequence_at_its_first_stop_token(
    rl_emulator: EmulatorHandle,
) -> None:
    training_client = tinker.ServiceClient().create_lora_training_client(base_model=MODEL, rank=4)
    try:
        tokenizer = training_client.get_tokenizer()
        sampler = training_client.save_weights_and_get_sampling_client()
        prompt = types.ModelInput.from_ints(tokenizer.encode("Question: 2+3?\nAnswer:"))
        stop_ids = tokenizer.encode("aeiou ", add_special_tokens=False)  # frequent characters
        free = types.SamplingParams(max_tokens=40, temperature=1.0, seed=7)
        stopped = types.SamplingParams(max_tokens=40, temperature=1.0, seed=7, stop=stop_ids)
        plain = sampler.sample(prompt=prompt, num_samples=8, sampling_params=free).result()
        cut = sampler.sample(prompt=prompt, num_samples=8, sampling_params=stopped).result()
        ended = 0
        for whole, seq in zip(plain.sequences, cut.sequences, strict=True):
            hits = [i for i, t in enumerate(whole.tokens) if t in stop_ids]
            if not hits:
                assert seq.tokens == whole.tokens and seq.stop_reason == whole.stop_reason
                continue
            ended += 1
            end = hits[0] + 1
            assert seq.tokens == whole.tokens[:end]  # the stop token kept, exactly once
            assert seq.logprobs == pytest.approx(whole.logprobs[:end])
            assert seq.stop_reason == "stop"
        assert ended, "no sample met a stop token: pick other stop ids or another seed"
        # the async twin honours them too
        again = asyncio.run(
            sampler.sample_async(prompt=prompt, num_samples=8, sampling_params=stopped)
        )
        assert [s.tokens for s in again.sequences] == [s.tokens for s in cut.sequences]
    finally:
        training_client.close()


def test_loss_fn_outputs_hold_logprobs_at_zero_weight_positions(
    rl_emulator: EmulatorHandle,
) -> None:
    training_client = tinker.ServiceClient().create_lora_training_client(base_model=MODEL, rank=4)
    try:
        tokenizer = training_client.get_tokenizer()
        prompt = tokenizer.encode("English: hello\nPig Latin:")
        answer = tokenizer.encode(" ello-hay\n", add_special_tokens=False)
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
        )
        everywhere = types.Datum(
            model_input=datum.model_input,
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * len(weights)},
        )
        reference = training_client.forward([everywhere], "cross_entropy").result()
        expected = reference.loss_fn_outputs[0]["logprobs"].tolist()
        assert all(v < 0 for v in expected)

        scored = training_client.forward([datum], "cross_entropy").result()
        fb = training_client.forward_backward([datum], "cross_entropy").result()
        for out in (scored, fb):
            got = out.loss_fn_outputs[0]["logprobs"].tolist()
            assert got == pytest.approx(expected, abs=1e-5)  # zero-weight positions included
        # the loss is still the weighted one: only the answer's tokens count
        answer_nll = -sum(v for v, w in zip(expected, weights, strict=True) if w)
        assert fb.metrics["loss:sum"] == pytest.approx(answer_nll, rel=1e-4)
        # a policy loss with zero weights on the prompt: those positions come back too
        policy = types.Datum(
            model_input=datum.model_input,
            loss_fn_inputs={
                "target_tokens": tokens[1:],
                "logprobs": expected,
                "advantages": [0.0] * (len(prompt) - 1) + [1.0] * len(answer),
                "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(answer),
            },
        )

        async def policy_pass() -> types.ForwardBackwardOutput:
            return await (await training_client.forward_backward_async([policy], "ppo"))

        out = asyncio.run(policy_pass())
        assert out.loss_fn_outputs[0]["logprobs"].tolist() == pytest.approx(expected, abs=1e-5)
    finally:
        training_client.close()


def test_the_builtin_model_takes_the_cookbook_rl_loop_s_369_token_prompts(
    rl_emulator: EmulatorHandle,
) -> None:
    service_client = tinker.ServiceClient()
    builtin = service_client.get_server_capabilities().supported_models[0]  # listed first
    assert builtin.max_context_length is not None and builtin.max_context_length >= 2048
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=4)
    try:
        tokenizer = training_client.get_tokenizer()
        prompt = tokenizer.encode("Solve: 12+7=? " * 30)[:369]
        assert len(prompt) == 369
        sampler = training_client.save_weights_and_get_sampling_client()
        params = types.SamplingParams(max_tokens=16, temperature=1.0, seed=0)
        seq = (
            sampler.sample(
                prompt=types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=params
            )
            .result()
            .sequences[0]
        )
        full = prompt + list(seq.tokens)
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(full[:-1]),
            loss_fn_inputs={
                "target_tokens": full[1:],
                "logprobs": [0.0] * (len(prompt) - 1) + list(seq.logprobs),
                "advantages": [0.0] * (len(prompt) - 1) + [1.0] * len(seq.tokens),
            },
        )
        out = training_client.forward_backward([datum], "importance_sampling").result()
        assert math.isfinite(out.metrics["loss:sum"])
    finally:
        training_client.close()
