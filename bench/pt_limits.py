"""The CPU and memory cost of the worst request each Post-Training operation accepts (docs/limits.md,
"Post-Training requests"), on the emulator's engine with the built-in tiny model, one torch thread.

    python bench/pt_limits.py        # one JSON line per operation: wall_s, cpu_s, peak RSS (MB)

Each request sits at the caps of `tgnb.emulator.rl.inputs` (512 samples / rows, 32,768 tokens);
the largest body the routes take (16 MiB through an upload URL) is parsed as the server parses it.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tgnb.emulator.rl.catalog import resolve
from tgnb.emulator.rl.engine import ResourceHost
from tgnb.emulator.rl.inputs import MAX_OP_TOKENS
from tgnb.emulator.rl.state import strict_json


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(name: str, fn: Callable[[], object]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    row = {
        "op": name,
        "wall_s": round(time.perf_counter() - wall, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        "peak_rss_mb": round(rss_mb()),
    }
    print(json.dumps(row), flush=True)


def seq(n: int) -> dict[str, Any]:
    return {"chunks": [{"encoded_text": {"tokens": [(7 * i) % 90 + 5 for i in range(n)]}}]}


def tensor(values: list[float], dtype: str = "float32") -> dict[str, Any]:
    return {"data": values, "dtype": dtype}


def main() -> None:
    torch.set_num_threads(1)
    spec = resolve("tgnb/tiny-llama", ())
    hosts: list[ResourceHost] = []
    measure(
        "load the model", lambda: hosts.append(ResourceHost(spec, lora_enabled=True, device="cpu"))
    )
    host = hosts[0]
    measure("open a rank-64 session", lambda: host.open_session("s", {"rank": 64}))
    n, length = MAX_OP_TOKENS // (spec.context_length - 1), spec.context_length - 1
    target = tensor([6] * length, "int64")
    ce = [{"model_input": seq(length), "loss_fn_inputs": {
        "target_tokens": target, "weights": tensor([1.0] * length)}}] * n  # fmt: skip
    measure(f"forward-backward CE {n}x{length}", lambda: host.forward_backward(
        "s", {"loss": {"type": "LOSS_TYPE_CROSS_ENTROPY"}, "samples": ce}))  # fmt: skip
    grpo = [{"model_input": seq(length), "loss_fn_inputs": {
        "target_tokens": target, "logprobs": tensor([-1.0] * length),
        "advantages": tensor([1.0] * length)}}] * n  # fmt: skip
    measure(f"forward-backward GRPO {n}x{length}", lambda: host.forward_backward(
        "s", {"loss": {"type": "LOSS_TYPE_GRPO"}, "samples": grpo}))  # fmt: skip
    custom = [{"model_input": seq(length), "loss_fn_inputs": {"target_tokens": target}}] * n
    grads = [tensor([0.01] * length)] * n
    measure(f"custom-forward-backward {n}x{length}", lambda: host.custom_forward_backward(
        "s", {"samples": custom, "gradients": grads}))  # fmt: skip
    measure("optim-step", lambda: host.optim_step("s", {}))
    measure("weights-sync", lambda: host.weights_sync("s", {}))
    with tempfile.TemporaryDirectory() as tmp:
        measure("training-checkpoint", lambda: host.save_training_checkpoint("s", Path(tmp) / "t"))
        measure(
            "inference-checkpoint", lambda: host.save_inference_checkpoint("s", Path(tmp) / "i")
        )
    for rows, tokens in ((512, 64), (128, 255)):
        body = {"model_inputs": [seq(1)], "num_samples": rows,
                "sampling_params": {"max_tokens": tokens, "temperature": 1.0, "seed": 0}}  # fmt: skip
        measure(f"sample {rows} rows x {tokens} tokens", lambda b=body: host.sample("s", b))
    prompts = {"model_inputs": [seq(192)] * 128, "num_samples": 1, "prompt_logprobs": True,
               "topk_prompt_logprobs": 20, "sampling_params": {"max_tokens": 63}}  # fmt: skip
    measure("sample 128 prompts x 192 tokens, top-20 prompt logprobs", lambda: host.sample(
        "s", prompts))  # fmt: skip
    blob = json.dumps({"x": [0.123456789] * ((16 << 20) // 13)}).encode()
    measure(f"parse a {len(blob) >> 20} MiB payload", lambda: strict_json(blob))


if __name__ == "__main__":
    main()
