"""Tinker scripts, written from Tinker's documentation (the "training and sampling" guide, the
loss-function tutorial and the cookbook's DPO recipe), run with one import changed:
``import tgnb.tinker as tinker``. Each talks to the real emulator daemon over HTTP through the
unmodified ``together`` SDK (``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY`` from the
``rl_emulator`` fixture) and learns on its tiny model. Nothing is faked."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # the one line that differs from a Tinker script

types = tinker.types
MODEL = "tgnb/tiny-llama"


def process_example(prompt: str, completion: str, tokenizer: Any) -> Any:
    """A supervised Datum as Tinker's guide builds one: weight 0 on the prompt, 1 on the answer."""
    prompt_tokens = tokenizer.encode(prompt, add_special_tokens=True)
    completion_tokens = tokenizer.encode(completion, add_special_tokens=False)
    tokens = prompt_tokens + completion_tokens
    weights = [0] * len(prompt_tokens) + [1] * len(completion_tokens)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens=tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]},
    )


EXAMPLES = [
    ("English: hello\nPig Latin:", " ello-hay\n"),
    ("English: world\nPig Latin:", " orld-way\n"),
]


def test_supervised_loop_reads_per_token_loss_from_loss_fn_outputs(
    rl_emulator: EmulatorHandle,
) -> None:
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=0)
    try:
        tokenizer = training_client.get_tokenizer()
        processed = [process_example(p, c, tokenizer) for p, c in EXAMPLES]
        per_token = []
        for _ in range(6):
            fwdbwd_future = training_client.forward_backward(processed, "cross_entropy")
            optim_future = training_client.optim_step(types.AdamParams(learning_rate=1e-2))
            fwdbwd_result = fwdbwd_future.result()
            optim_future.result()
            logprobs = np.concatenate(
                [o["logprobs"].tolist() for o in fwdbwd_result.loss_fn_outputs]
            )
            weights = np.concatenate([d.loss_fn_inputs["weights"].tolist() for d in processed])
            assert len(logprobs) == len(weights)
            per_token.append(-np.dot(logprobs, weights) / weights.sum())
            # the service's summed loss is the same number, times the counted tokens
            assert fwdbwd_result.metrics["loss:sum"] == pytest.approx(
                per_token[-1] * weights.sum(), rel=1e-4
            )
        assert per_token[-1] < 0.75 * per_token[0], per_token
        sampling_client = training_client.save_weights_and_get_sampling_client(name="pig-latin")
        prompt = types.ModelInput.from_ints(tokenizer.encode(EXAMPLES[0][0]))
        params = types.SamplingParams(max_tokens=12, temperature=0.0, stop=["\n"])
        result = sampling_client.sample(
            prompt=prompt, sampling_params=params, num_samples=1
        ).result()
        assert result.sequences and result.sequences[0].tokens
    finally:
        training_client.close()


@pytest.mark.slow
def test_rl_loop_importance_sampling_raises_the_reward(rl_emulator: EmulatorHandle) -> None:
    """Sample, score (reward 1 for an answer that starts with a digit), center the rewards per
    group, ``importance_sampling``, ``optim_step``, ``save_weights_and_get_sampling_client``."""
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=1)
    try:
        tokenizer = training_client.get_tokenizer()
        prompts = [tokenizer.encode(f"What is {a}+{a}? Answer:") for a in range(4)]
        sampling_client = training_client.save_weights_and_get_sampling_client()
        mean_rewards = []
        for step in range(10):
            params = types.SamplingParams(max_tokens=1, temperature=1.0, seed=step)
            futures = [
                sampling_client.sample(
                    prompt=types.ModelInput.from_ints(p), num_samples=8, sampling_params=params
                )
                for p in prompts
            ]
            datums, rewards = [], []
            for prompt, future in zip(prompts, futures, strict=True):
                sequences = future.result().sequences
                group = [float(tokenizer.decode(s.tokens).strip()[:1].isdigit()) for s in sequences]
                rewards += group
                mean = sum(group) / len(group)
                for seq, r in zip(sequences, group, strict=True):
                    tokens = list(seq.tokens)
                    full, pad = prompt + tokens, [0.0] * (len(prompt) - 1)
                    datums.append(
                        types.Datum(
                            model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={
                                "target_tokens": full[1:],
                                "logprobs": pad + list(seq.logprobs),
                                "advantages": pad + [r - mean] * len(tokens),
                            },
                        )
                    )
            fb = training_client.forward_backward(datums, "importance_sampling")
            opt = training_client.optim_step(types.AdamParams(learning_rate=2e-2))
            fb.result()
            opt.result()
            sampling_client = training_client.save_weights_and_get_sampling_client()
            mean_rewards.append(sum(rewards) / len(rewards))
        first, last = sum(mean_rewards[:3]) / 3, sum(mean_rewards[-3:]) / 3
        assert last > first + 0.2, mean_rewards
    finally:
        training_client.close()


def test_dpo_through_forward_backward_custom(rl_emulator: EmulatorHandle) -> None:
    """The cookbook's DPO loss as a custom loss over (chosen, rejected) pairs, with reference
    logprobs from ``forward`` before training."""
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=2)
    try:
        tokenizer = training_client.get_tokenizer()
        pairs = [("Q: 2+2=", " 4"), ("Q: 1+2=", " 3")]
        data = []
        for prompt, good in pairs:
            data.append(process_example(prompt, good, tokenizer))
            data.append(process_example(prompt, " x", tokenizer))
        ref = training_client.forward(data, "cross_entropy").result().loss_fn_outputs
        ref_sums = [float(np.sum(o["logprobs"].tolist())) for o in ref]
        beta = 0.5

        def dpo_loss(batch: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
            import torch

            sums = [
                (lp * torch.tensor(d.loss_fn_inputs["weights"].tolist())).sum()
                for d, lp in zip(batch, logprobs, strict=True)
            ]
            margins = [
                beta * ((sums[i] - ref_sums[i]) - (sums[i + 1] - ref_sums[i + 1]))
                for i in range(0, len(sums), 2)
            ]
            stacked = torch.stack(margins)
            loss = -torch.nn.functional.logsigmoid(stacked).mean()
            return loss, {"dpo_loss": loss.item(), "margin": stacked.mean().item()}

        history = []
        for _ in range(5):
            result = training_client.forward_backward_custom(data, dpo_loss).result()
            training_client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
            history.append(result.metrics)
        assert history[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-3)  # starts at ref
        assert history[-1]["dpo_loss"] < 0.5 and history[-1]["margin"] > 0.5, history
    finally:
        training_client.close()


def _sft_step(client: Any, data: list[Any]) -> tuple[float, list[list[float]]]:
    fb = client.forward_backward(data, "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    out = fb.result()
    return out.metrics["loss:sum"], [o["logprobs"].tolist() for o in out.loss_fn_outputs]


def test_save_state_then_load_state_with_optimizer_continues_bit_identically(
    rl_emulator: EmulatorHandle,
) -> None:
    service_client = tinker.ServiceClient()
    first = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=5)
    second = resumed = None
    try:
        tokenizer = first.get_tokenizer()
        data = [process_example(p, c, tokenizer) for p, c in EXAMPLES]
        for _ in range(2):
            _sft_step(first, data)
        path = first.save_state("step-2").result().path
        expected = [_sft_step(first, data) for _ in range(3)]

        second = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=5)
        second.load_state_with_optimizer(path).result()
        assert [_sft_step(second, data) for _ in range(3)] == expected  # exact, not approximate

        resumed = service_client.create_training_client_from_state_with_optimizer(path)
        assert resumed.get_info().lora_rank == 4
        assert [_sft_step(resumed, data) for _ in range(3)] == expected

        # weights only: the same first loss (same weights), then another path (fresh Adam)
        second.load_state(path).result()
        fresh = [_sft_step(second, data) for _ in range(2)]
        assert fresh[0] == expected[0] and fresh[1] != expected[1]
    finally:
        for client in (first, second, resumed):
            if client is not None:
                client.close()


def downloaded_logprobs(emulator: EmulatorHandle, path: str, tokens: list[int], out: Path) -> Any:
    """The logprobs of `tokens` under inference checkpoint `path`'s downloaded adapter, loaded
    with peft on the base model (the first token has none)."""
    from together.post_training import download_checkpoint

    cid = path.rsplit("/", 1)[-1]  # tinker://<run>/sampler_weights/<checkpoint id>
    variant = "CHECKPOINT_VARIANT_ADAPTER"
    download_checkpoint(emulator.client(), cid, variant=variant, output_dir=str(out))
    return adapter_logprobs(out, tokens)


def adapter_logprobs(out: Path, tokens: list[int]) -> Any:
    """The logprobs of `tokens` under the LoRA adapter in folder `out` on the base model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tgnb.emulator.rl.catalog import resolve

    base = AutoModelForCausalLM.from_pretrained(resolve(MODEL).path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out)).eval()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        lsm = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
    return lsm.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()


def test_sampling_client_from_a_saved_weights_path(
    rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    """A sampler on a ``save_weights_for_sampler`` path samples the weights of its step, and
    the checkpoint's download holds those weights (saved before anything was published: the
    emulator's inference checkpoints held the published, untrained, adapter)."""
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=3)
    samplers = []
    try:
        tokenizer = training_client.get_tokenizer()
        data = [process_example(p, c, tokenizer) for p, c in EXAMPLES]
        for _ in range(4):
            _sft_step(training_client, data)
        sampler_path = training_client.save_weights_for_sampler("after-4").result().path
        live = training_client.save_weights_and_get_sampling_client()
        for _ in range(2):  # the trainer moves on; the saved path keeps step 4
            _sft_step(training_client, data)

        prompt = types.ModelInput.from_ints(tokenizer.encode(EXAMPLES[0][0] + EXAMPLES[0][1]))
        saved = service_client.create_sampling_client(model_path=sampler_path)
        from_trainer = training_client.create_sampling_client(sampler_path)
        base = service_client.create_sampling_client(base_model=MODEL)
        samplers += [saved, from_trainer, base]
        assert saved.get_base_model() == MODEL
        assert saved.get_tokenizer().encode("ab") == tokenizer.encode("ab")
        at_4 = live.compute_logprobs(prompt).result()
        assert saved.compute_logprobs(prompt).result() == pytest.approx(at_4, abs=1e-5)
        assert from_trainer.compute_logprobs(prompt).result() == pytest.approx(at_4, abs=1e-5)
        got = downloaded_logprobs(rl_emulator, sampler_path, prompt.to_ints(), tmp_path)
        assert got == pytest.approx(at_4[1:], abs=1e-5)
        base_lp = base.compute_logprobs(prompt).result()
        assert sum(x for x in at_4 if x) > sum(x for x in base_lp if x) + 1.0  # it learned
        params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=0)
        out = saved.sample(prompt=prompt, num_samples=3, sampling_params=params).result()
        assert len(out.sequences) == 3
    finally:
        for s in samplers:
            s.close()
        training_client.close()


def test_many_futures_in_flight_resolve_in_order(rl_emulator: EmulatorHandle) -> None:
    """Tinker's advice: submit forward_backward and optim_step before waiting on either. Here
    4 steps and 12 samples are all in flight before the first result is read; then the same
    through the ``_async`` methods and ``asyncio.gather``."""
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=4)
    try:
        tokenizer = training_client.get_tokenizer()
        data = [process_example(p, c, tokenizer) for p, c in EXAMPLES]
        sampler = training_client.save_weights_and_get_sampling_client()
        prompt = types.ModelInput.from_ints(tokenizer.encode("English: hello"))
        params = types.SamplingParams(max_tokens=3, temperature=1.0)
        steps = []
        samples = [sampler.sample(prompt=prompt, num_samples=2, sampling_params=params)]
        for _ in range(4):
            steps.append(training_client.forward_backward(data, "cross_entropy"))
            steps.append(training_client.optim_step(types.AdamParams(learning_rate=3e-3)))
            samples += [
                sampler.sample(prompt=prompt, num_samples=2, sampling_params=params)
                for _ in range(3)
            ]
        losses = [f.result().metrics["loss:sum"] for f in steps[0::2]]
        for f in steps[1::2]:
            f.result()
        assert all(b < a for a, b in itertools.pairwise(losses)), losses  # each after the last step
        assert all(len(s.result().sequences) == 2 for s in samples)

        async def async_steps() -> list[float]:
            out = []
            for _ in range(2):
                fb = await training_client.forward_backward_async(data, "cross_entropy")
                opt = await training_client.optim_step_async(types.AdamParams(learning_rate=3e-3))
                fb_result, _ = await asyncio.gather(fb.result_async(), opt.result_async())
                out.append(fb_result.metrics["loss:sum"])
            info = await training_client.get_info_async()
            assert info.model_name == MODEL
            return out

        more = asyncio.run(async_steps())
        assert more[0] < losses[-1] and more[1] < more[0]
    finally:
        training_client.close()


def test_tinker_loss_defaults_are_sent_explicitly(rl_emulator: EmulatorHandle) -> None:
    """Together documents no PPO/CISPO defaults; the layer sends Tinker's (PPO [0.8, 1.2],
    CISPO [0.0, 4.0]), and a config the user gives wins."""
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=4)
    try:
        tokens = training_client.get_tokenizer().encode("What is 1+1? 2")
        n = len(tokens) - 1
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": tokens[1:],
                "logprobs": [-3.0] * n,
                "advantages": [1.0] * n,
            },
        )
        training_client.forward([datum], "cispo").result()
        training_client.forward([datum], "ppo").result()
        training_client.forward([datum], "ppo", {"clip_high_threshold": 1.5}).result()
        sent = [
            r["body"]["loss"]
            for r in rl_emulator.requests()
            if r["path"].endswith("/operations/forward-backward") and r["method"] == "POST"
        ][-3:]
        assert sent == [
            {
                "type": "LOSS_TYPE_CISPO",
                "cispo_params": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
            },
            {
                "type": "LOSS_TYPE_PPO",
                "ppo_params": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
            },
            {
                "type": "LOSS_TYPE_PPO",
                "ppo_params": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.5},
            },
        ]
    finally:
        training_client.close()


def test_capabilities_info_and_a_tinker_uri_refused(rl_emulator: EmulatorHandle) -> None:
    service_client = tinker.ServiceClient()
    caps = service_client.get_server_capabilities()
    from tgnb.emulator.rl.catalog import same_model

    listed = [m.model_name for m in caps.supported_models]
    assert Path(listed[0]).is_dir() and same_model(MODEL, listed[0])  # MODEL is its alias
    assert asyncio.run(service_client.get_server_capabilities_async()) == caps
    with pytest.raises(ValueError, match="is not a checkpoint path"):
        service_client.create_sampling_client(model_path="tinker://run-1/final")
    with pytest.raises(ValueError, match="Either model_path or base_model"):
        service_client.create_sampling_client()


class _CountingHub:
    """A listening socket standing in for the Hugging Face Hub (``HF_ENDPOINT``): it counts the
    connections made to it and drops each, as an unreachable Hub would."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.mark.parametrize(
    "cache", ["emulator's cache", pytest.param("empty cache", marks=pytest.mark.slow)]
)
def test_get_tokenizer_asks_nothing_of_the_hub(
    rl_emulator: EmulatorHandle, cache: str, tmp_path: Path
) -> None:
    """A fresh interpreter without ``HF_HUB_OFFLINE``, its Hub an endpoint that counts
    connections: ``get_tokenizer()`` of the served tiny model loads it from the Hugging Face
    cache the emulator wrote, or with an empty cache builds it in memory, making no request."""
    script = textwrap.dedent(
        """
        import tgnb.tinker as tinker
        client = tinker.ServiceClient().create_lora_training_client(base_model={model!r}, rank=4)
        try:
            tok = client.get_tokenizer()
            print("DECODED", tok.decode(tok.encode("1+1=2")))
        finally:
            client.close()
        """
    ).format(model=MODEL)
    hub = _CountingHub()
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = hub.url
    if cache == "empty cache":
        env["HF_HUB_CACHE"] = str(tmp_path / "hub")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        hub.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DECODED 1+1=2" in proc.stdout
    assert hub.connections == 0, proc.stderr[-3000:]


def test_every_tinker_client_call_is_covered_or_named_as_unserved() -> None:
    """The genuine ``tinker`` 0.23.1 clients are the list of calls: each public one exists here,
    or the module docstring names it as one Post-Training cannot serve."""
    import tinker as genuine

    doc = tinker.__doc__ or ""
    pairs = [
        (genuine.ServiceClient, tinker.ServiceClient),
        (genuine.TrainingClient, tinker.TrainingClient),
        (genuine.SamplingClient, tinker.SamplingClient),
    ]
    for theirs, ours in pairs:
        for name in dir(theirs):
            if not name.startswith("_") and not hasattr(ours, name):
                assert f"``{theirs.__name__}.{name}``" in doc or f"``{name}``" in doc, name
