"""Post-Training emulator overheads, as ratios measured side by side in one run.

A real emulator daemon (``tgnb emulator``, loopback HTTP) is started; the same model is also loaded
in this process (`tgnb.emulator.rl.engine.ResourceHost`, the engine the daemon runs). Rounds
alternate between the two so both see the same machine load; each timed call starts after a short
pause, since the other process's OpenMP threads keep spinning a while after a computation (on a
2-core machine that alone can slow the next one several times).

- ``fb``: one forward-backward (cross-entropy) on 32 sequences of 64 tokens, through the unmodified
  SDK (``Trainer.forward_backward``: its request transform, JSON, HTTP, the session's FIFO, the
  worker thread) and through plain HTTP (JSON encoding in the timed part) ÷ the same call in
  process; the median of the per-round ratios. Target <= 1.25. Measured on the tiny model (where
  the fixed per-request cost weighs most) and, with the 100M model, again on a model whose step
  is not dwarfed by it.
- ``sample``: 32 samples of up to 64 new tokens, tokens per second through the SDK
  (``Generator.sample``) ÷ in-process generation: ``ResourceHost.sample`` (the same engine) and
  plain ``transformers`` ``generate`` on the base model (both printed). Target >= 0.8.
- ``memory``: the engine's tensor bytes (base, adapters, published copies, gradients, Adam state)
  with 5 LoRA sessions ÷ with 1, each session after one forward-backward + optim-step (admin route
  ``/_emulator/rl/resources/{id}/memory``). Target <= 1.3. Reported for the built-in tiny model
  (whose rank-8 adapters are not small beside its ~90k base parameters: the target cannot hold
  there) and for a ~100M-parameter Llama with random weights built locally (``--no-100m`` skips it).

Usage: ``python bench/post_training.py [--rounds 7] [--no-100m] [--threads 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
TINY = "tgnb/tiny-llama"


def ce_batch(n: int, length: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        toks = [rng.randrange(3, 100) for _ in range(length + 1)]
        out.append(
            {
                "model_input": {"chunks": [{"encoded_text": {"tokens": toks[:-1]}}]},
                "loss_fn_inputs": {
                    "target_tokens": {"data": toks[1:], "dtype": "int64"},
                    "weights": {"data": [1.0] * length, "dtype": "float32"},
                },
            }
        )
    return out


CE: Any = {"type": "LOSS_TYPE_CROSS_ENTROPY", "cross_entropy_params": {}}


PAUSE_S = 0.5


def timed(fn: Any) -> tuple[float, Any]:
    time.sleep(PAUSE_S)  # the other process's OpenMP threads stop spinning (2 shared cores)
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def count_tokens(result: dict[str, Any]) -> int:
    return sum(len(s["tokens"]) for r in result["results"] for s in r["sequences"])


def hf_generate(host: Any, prompt: list[int], n: int, max_new: int, seed: int) -> int:
    """Plain transformers sampling on the base model; generated tokens up to each EOS."""
    import torch

    model, eos = host.base, host.tokenizer.eos_token_id
    torch.manual_seed(seed)
    ids = torch.tensor([prompt] * n)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=max_new,
            top_k=0,
            pad_token_id=host.tokenizer.pad_token_id,
        )
    total = 0
    for row in out[:, len(prompt) :].tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def speed(rounds: int, emu: Any, model: str = TINY, label: str = "tiny") -> None:
    from together.post_training import ModelResourcesClient, SamplingParams

    from tgnb.emulator.rl.catalog import resolve
    from tgnb.emulator.rl.engine import ResourceHost

    host = ResourceHost(resolve(model), lora_enabled=True, device="cpu")
    host.open_session("local", {"rank": 8})
    body: dict[str, Any] = {"loss": CE, "samples": ce_batch(32, 64)}
    prompt = [1, 10, 11, 12]
    sample_body: dict[str, Any] = {
        "model_inputs": [{"chunks": [{"encoded_text": {"tokens": prompt}}]}],
        "num_samples": 32,
        "sampling_params": {"max_tokens": 64, "temperature": 1.0, "seed": 0},
    }
    with (
        ModelResourcesClient.create(base_model=model, interval=0.1, ready_timeout=600) as mr,
        mr.create_session(lora_config={"rank": 8}, interval=0.1) as sess,
    ):
        tr, gen = sess.trainer, sess.generator
        fb_local, fb_emu, fb_raw, s_local, s_emu, s_hf = [], [], [], [], [], []
        http = httpx.Client(
            base_url=emu.base_url, headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=300
        )
        path = f"/v1/rl/training-sessions/{sess.session_id}/operations/forward-backward"

        def raw_fb() -> Any:
            data = json.dumps(body).encode()
            headers = {"Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"}
            out = http.post(path, content=data, headers=headers).json()
            assert out["status"] == "TRAINING_OPERATION_STATUS_COMPLETED", out
            return out

        for i in range(rounds + 1):  # round 0 warms both sides up
            a, _ = timed(lambda: host.forward_backward("local", body))
            b, _ = timed(lambda: tr.forward_backward(samples=body["samples"], loss=CE))
            r, _ = timed(raw_fb)
            sb = {
                **sample_body,
                "sampling_params": {**sample_body["sampling_params"], "seed": i},
            }
            c, out_local = timed(lambda sb=sb: host.sample("local", sb))
            d, out_emu = timed(
                lambda sb=sb, i=i: gen.sample(
                    sb["model_inputs"][0],
                    num_samples=32,
                    sampling_params=SamplingParams(max_tokens=64, temperature=1.0, seed=i),
                )
            )
            e, n_hf = timed(lambda i=i: hf_generate(host, prompt, 32, 64, i))
            if i == 0:
                continue
            fb_local.append(a)
            fb_emu.append(b)
            fb_raw.append(r)
            s_local.append(count_tokens(out_local) / c)
            s_emu.append(sum(len(s.tokens) for s in out_emu.sequences) / d)
            s_hf.append(n_hf / e)
    med = statistics.median
    fb_ratio = med([b / a for a, b in zip(fb_local, fb_emu, strict=False)])
    raw_ratio = med([r / a for a, r in zip(fb_local, fb_raw, strict=False)])
    s_ratio = med([e / loc for loc, e in zip(s_local, s_emu, strict=False)])
    hf_ratio = med([e / h for h, e in zip(s_hf, s_emu, strict=False)])
    print(f"fb 32x64 ({label}): in-process {med(fb_local) * 1000:.1f} ms, "
          f"through the emulator {med(fb_emu) * 1000:.1f} ms")  # fmt: skip
    print(f"  fb ratio emulator / in-process = {fb_ratio:.3f} through the SDK, {raw_ratio:.3f} "
          f"through plain HTTP + JSON ({med(fb_raw) * 1000:.1f} ms)  (median of {rounds} paired "
          "rounds; target <= 1.25)")  # fmt: skip
    print(f"sample 32x64 ({label}): in-process engine {med(s_local):.0f} tok/s, "
          f"transformers generate {med(s_hf):.0f} tok/s, through the emulator {med(s_emu):.0f} tok/s")  # fmt: skip
    print(f"  sampling throughput ratio emulator / in-process engine = {s_ratio:.3f}, "
          f"/ transformers generate = {hf_ratio:.3f}  (target >= 0.8)")  # fmt: skip


def memory(emu: Any, model: str, rank: int, length: int) -> float:
    from together.post_training import AdamParams, ModelResourcesClient

    samples: Any = ce_batch(2, length)
    sizes = []
    for n in (1, 5):
        with ModelResourcesClient.create(base_model=model, interval=0.1, ready_timeout=600) as mr:
            sessions = [
                mr.create_session(lora_config={"rank": rank, "alpha": 2 * rank}, interval=0.1)
                for _ in range(n)
            ]
            for s in sessions:
                s.trainer.forward_backward(samples=samples, loss=CE)
                s.trainer.optim_step(adam_params=AdamParams(learning_rate=1e-4))
            sizes.append(emu.rl_memory(mr.model_resources_id))
            for s in sessions:
                s.stop()
    ratio = sizes[1] / sizes[0]
    print(f"memory ({model if model == TINY else '~100M Llama'}, LoRA rank {rank}): "
          f"1 session {sizes[0] / 2**20:.1f} MiB, 5 sessions {sizes[1] / 2**20:.1f} MiB, "
          f"ratio {ratio:.3f}  (target <= 1.3)")  # fmt: skip
    return ratio


def build_100m(path: Path) -> int:
    """A Llama of about 100M parameters with random weights and the tiny tokenizer, saved to `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tgnb.tasks import assets

    ids = assets.vocab()
    config = LlamaConfig(
        vocab_size=len(ids),
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=14,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=256,
        pad_token_id=ids[assets.PAD],
        bos_token_id=ids[assets.BOS],
        eos_token_id=ids[assets.EOS],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    assets.build_tokenizer().save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-100m", action="store_true")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on both sides (default 1: on a small shared machine a 2-thread "
        "OpenMP team spins whenever one of its threads is descheduled)",
    )
    ns = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(ns.threads)  # this process and the daemon alike
    import torch

    torch.set_num_threads(ns.threads)
    from tgnb.emulator.testing import running_emulator

    with tempfile.TemporaryDirectory(prefix="tgnb-bench-pt-") as tmp:
        extra = Path(tmp) / "llama-100m"
        if not ns.no_100m:
            params = build_100m(extra)
            print(f"built a {params / 1e6:.0f}M-parameter Llama in {extra}")
        with running_emulator(Path(tmp), time_scale=0.01, rl_models=str(extra)) as emu:
            os.environ.update(
                TOGETHER_BASE_URL=emu.base_url,
                TOGETHER_API_KEY=emu.api_key,
                HF_HUB_OFFLINE="1",
            )
            speed(ns.rounds, emu)
            memory(emu, TINY, 8, 16)
            if not ns.no_100m:
                memory(emu, str(extra), 8, 16)
                # The path users run: a model whose step is not dwarfed by the fixed per-request
                # cost (the SDK's request conversion, JSON, HTTP), which the tiny model's is.
                speed(max(2, ns.rounds // 2), emu, str(extra), "~100M")
    return 0


if __name__ == "__main__":
    sys.exit(main())
