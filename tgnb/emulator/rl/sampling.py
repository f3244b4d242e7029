"""The sample operation: batched generation with a KV cache, per-token and prompt logprobs.

All ``len(model_inputs) x num_samples`` rows run as ONE left-padded batch: one prefill, then one
forward per generated token for the whole batch (the same work as ``model.generate``).

- ``temperature`` 0 is greedy, else at least `MIN_TEMPERATURE`; ``top_k`` -1 (or 0) is off;
  ``top_p`` 1 is off, at least `MIN_TOP_P`.
- Work caps: ``len(model_inputs) x num_samples`` rows <= `MAX_BATCH_SIZE`, rows x ``max_tokens``
  <= `MAX_SAMPLE_TOKENS`, prompt tokens x samples <= `MAX_OP_TOKENS`; a stopped session's running
  sample ends at the next token (`generate`'s ``cancelled``).
- ``seed``: the same seed and request give the same tokens (a dedicated torch.Generator).
- A row stops at the tokenizer's EOS token or a stop token id (``stop_reason`` STOP; the stop token
  is kept as the last token), at a stop string (STOP; the tokens up to and including the one that
  completed the string are kept, so the stop string stays in the decoded text), or after
  ``max_tokens`` or at the context length (LENGTH).
- ``logprobs`` are the model's log-probabilities of the sampled tokens at temperature 1 (before
  temperature, top-k and top-p), so they equal what forward/forward-backward compute for the same
  weights and importance ratios start at exactly 1.
- ``prompt_logprobs``: full prompt length, entry 0 is 0; ``topk_prompt_logprobs`` (k <= 20): entry 0
  empty, then the k most likely tokens at each prompt position.
- Tokens are int64 sent as strings, as the real service does.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgnb.emulator.rl.inputs import (
    MAX_BATCH_SIZE,
    MAX_OP_TOKENS,
    MAX_SAMPLE_TOKENS,
    OperationCancelled,
    RLInputError,
    model_tokens,
)

MAX_TOPK_PROMPT = 20
#: Below it, logits / temperature overflow float32 (use 0 for greedy); top_p below it is a float32 0.
MIN_TEMPERATURE = 1e-3
MIN_TOP_P = 1e-6


@dataclass
class Request:
    prompts: list[list[int]]
    num_samples: int
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop_strings: list[str]
    stop_ids: list[int]
    prompt_logprobs: bool
    topk_prompt: int


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RLInputError(field, f"must be an integer in {low}..{high}, got {value!r}")
    return value


def _num(value: Any, field: str, low: float, high: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise RLInputError(field, f"must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def parse(
    body: Mapping[str, Any], vocab: int, context: int, defaults: Mapping[str, Any]
) -> Request:
    """Validate a sample body against the model (vocabulary, context length)."""
    raw = body.get("model_inputs")
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not raw:
        raise RLInputError("model_inputs", "must be a non-empty list of ModelInput")
    prompts = [model_tokens(m, f"model_inputs[{i}]", vocab, context) for i, m in enumerate(raw)]
    n = body.get("num_samples")
    n = _int(defaults["n"] if n is None else n, "num_samples", 1, MAX_BATCH_SIZE)
    if len(prompts) * n > MAX_BATCH_SIZE:
        raise RLInputError(
            "num_samples",
            f"{len(prompts)} model_inputs x {n} samples exceed max_batch_size {MAX_BATCH_SIZE}",
        )
    if sum(len(p) for p in prompts) * n > MAX_OP_TOKENS:
        raise RLInputError(
            "model_inputs", f"more than {MAX_OP_TOKENS} prompt tokens x samples in one operation"
        )
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, Mapping):
        raise RLInputError("sampling_params", "must be an object")
    known = {"max_tokens", "seed", "stop", "temperature", "top_k", "top_p"}
    unknown = sorted(set(sp) - known)
    if unknown:
        raise RLInputError(f"sampling_params.{unknown[0]}", f"unknown ({', '.join(sorted(known))})")
    get = lambda k, d: d if sp.get(k) is None else sp[k]  # noqa: E731
    max_tokens = _int(
        get("max_tokens", defaults["max_tokens"]), "sampling_params.max_tokens", 1, context
    )
    if len(prompts) * n * max_tokens > MAX_SAMPLE_TOKENS:
        raise RLInputError(
            "sampling_params.max_tokens",
            f"{len(prompts) * n} rows x {max_tokens} tokens exceed {MAX_SAMPLE_TOKENS} generated "
            "tokens per operation; ask for fewer samples or tokens",
        )
    longest = max(len(p) for p in prompts)
    if longest >= context:
        raise RLInputError(
            "model_inputs", f"a prompt of {longest} tokens fills the context ({context})"
        )
    temperature = _num(
        get("temperature", defaults["temperature"]), "sampling_params.temperature", 0, 100
    )
    if 0 < temperature < MIN_TEMPERATURE:
        raise RLInputError(
            "sampling_params.temperature",
            f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {temperature!r}",
        )
    top_k = _int(get("top_k", -1), "sampling_params.top_k", -1, vocab)
    top_p = _num(get("top_p", 1.0), "sampling_params.top_p", 0, 1)
    if top_p < MIN_TOP_P:
        raise RLInputError(
            "sampling_params.top_p",
            f"must be in [{MIN_TOP_P:g}, 1] (1 turns it off), got {top_p!r}",
        )
    seed = get("seed", None)
    if seed is None:
        seed = secrets.randbits(63)
    else:
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise RLInputError(
                "sampling_params.seed", f"must be an integer, got {seed!r}"
            ) from None
    stop = get("stop", [])
    stop = [stop] if isinstance(stop, (str, int)) else stop
    if not isinstance(stop, Sequence) or any(isinstance(s, bool) for s in stop):
        raise RLInputError("sampling_params.stop", "must be a list of strings (or token ids)")
    strings = [s for s in stop if isinstance(s, str)]
    ids = [s for s in stop if isinstance(s, int)]
    if len(strings) + len(ids) != len(stop) or any(not s for s in strings):
        raise RLInputError(
            "sampling_params.stop", "must be a list of non-empty strings or token ids"
        )
    if any(not 0 <= i < vocab for i in ids):
        raise RLInputError("sampling_params.stop", f"token ids must lie in [0, {vocab})")
    want_prompt = body.get("prompt_logprobs", False)
    if not isinstance(want_prompt, bool) and want_prompt is not None:
        raise RLInputError("prompt_logprobs", "must be true or false")
    topk = body.get("topk_prompt_logprobs") or 0
    topk = _int(topk, "topk_prompt_logprobs", 0, MAX_TOPK_PROMPT)
    return Request(prompts, n, max_tokens, temperature, top_k, top_p, seed % 2**63, strings, ids,
                   bool(want_prompt), topk)  # fmt: skip


def _pick(logits: Any, req: Request, gen: Any) -> Any:
    """The next token of each row under temperature / top-k / top-p."""
    import torch

    if req.temperature == 0:
        return logits.argmax(-1)
    scores = logits / req.temperature
    if 0 < req.top_k < scores.shape[-1]:
        kth = torch.topk(scores, req.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if req.top_p < 1:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cum = torch.softmax(sorted_scores, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_scores, -1) >= req.top_p  # keep the token crossing top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
    probs = torch.softmax(scores, -1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def generate(
    model: Any,
    tokenizer: Any,
    req: Request,
    version: int,
    device: str,
    cancelled: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Run `req` on `model` (already holding the weights to sample from); `OperationCancelled`
    at the next token once `cancelled()` (the session was stopped)."""
    import torch

    rows = [p for p in req.prompts for _ in range(req.num_samples)]
    batch, width = len(rows), max(len(p) for p in req.prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((batch, width), int(pad), dtype=torch.long)
    attn = torch.zeros((batch, width + req.max_tokens), dtype=torch.long)
    for i, p in enumerate(rows):
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1  # generated slots too: step t attends to a prefix of it
    ids, attn = ids.to(device), attn.to(device)
    pos = (attn[:, :width].cumsum(-1) - 1).clamp(min=0)
    context = int(getattr(model.config, "max_position_embeddings", 0) or 10**9)
    limit = torch.tensor([min(req.max_tokens, context - len(p)) for p in rows], device=device)
    steps = int(limit.max())
    eos = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    stop_ids = torch.tensor(sorted(eos | set(req.stop_ids)) or [-1], device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(req.seed)
    out_tok = torch.zeros((batch, steps), dtype=torch.long, device=device)
    out_lp = torch.zeros((batch, steps), dtype=torch.float32, device=device)
    lengths = torch.full((batch,), steps, dtype=torch.long, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    tail = max((len(s) for s in req.stop_strings), default=0) + 8
    prompt_info: dict[str, Any] = {}
    cache_arg = _cache_kwarg(model)
    with torch.no_grad():
        want_prompt = req.prompt_logprobs or req.topk_prompt > 0
        keep = 0 if want_prompt else 1
        result = model(input_ids=ids, attention_mask=attn[:, :width], position_ids=pos, use_cache=True,
                       logits_to_keep=keep)  # fmt: skip
        if want_prompt:
            prompt_info = _prompt_logprobs(result.logits, rows, width, req)
        cache = _cache_of(result)
        logits = result.logits[:, -1, :].float()
        for t in range(steps):
            if cancelled():
                raise OperationCancelled("the training session was stopped during this sample")
            tok = _pick(logits, req, gen)
            lp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
            out_tok[:, t], out_lp[:, t] = tok, lp
            newly = ~done & torch.isin(tok, stop_ids)
            if req.stop_strings:
                newly |= _hits_stop_string(
                    tokenizer, out_tok, t, done | newly, req.stop_strings, tail
                )
            ended = ~done & (newly | (t + 1 >= limit))
            lengths = torch.where(ended, t + 1, lengths)
            stopped |= newly & ~done
            done |= ended
            if bool(done.all()) or t + 1 == steps:
                break
            pos = pos[:, -1:] + 1
            result = model(
                input_ids=tok[:, None],
                attention_mask=attn[:, : width + t + 1],
                position_ids=pos,
                use_cache=True,
                **{cache_arg: cache},
            )
            cache = _cache_of(result)
            logits = result.logits[:, -1, :].float()
    toks, lps = out_tok.cpu().tolist(), out_lp.cpu().tolist()
    ns, stop_flags = lengths.cpu().tolist(), stopped.cpu().tolist()
    results = []
    for i in range(len(req.prompts)):
        seqs = []
        for r in range(i * req.num_samples, (i + 1) * req.num_samples):
            n = ns[r]
            seqs.append(
                {
                    "tokens": [str(x) for x in toks[r][:n]],
                    "logprobs": lps[r][:n],
                    "stop_reason": "STOP_REASON_STOP" if stop_flags[r] else "STOP_REASON_LENGTH",
                    "prompt_cache_hit_tokens": 0,
                }
            )
        item: dict[str, Any] = {
            "sequences": seqs,
            "policy_segments": [{"start_token": 0, "version": version}],
        }
        for key, values in prompt_info.items():
            item[key] = values[i]
        results.append(item)
    return {"results": results}


def _cache_kwarg(model: Any) -> str:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _cache_of(result: Any) -> Any:
    cache = getattr(result, "cache", None)
    return cache if cache is not None else getattr(result, "past_key_values", None)


def _hits_stop_string(
    tokenizer: Any, out: Any, t: int, skip: Any, stops: list[str], tail: int
) -> Any:
    """Rows (not in `skip`) whose newest token completed one of `stops` (decodes a short tail)."""
    import torch

    hit = torch.zeros_like(skip)
    recent = out[:, max(0, t + 1 - tail) : t + 1].cpu().tolist()
    for row in (~skip).nonzero().flatten().cpu().tolist():
        # checked after every token, so the first tail holding a stop string is the one that
        # completed it
        if any(s in tokenizer.decode(recent[row]) for s in stops):
            hit[row] = True
    return hit


def _prompt_logprobs(
    logits: Any, rows: list[list[int]], width: int, req: Request
) -> dict[str, Any]:
    """Teacher-forced prompt logprobs (and top-k) of each model input, from the prefill."""
    import torch

    full: list[list[float]] = []
    topk: list[list[dict[str, Any]]] = []
    for i in range(len(req.prompts)):
        p = rows[i * req.num_samples]
        start = width - len(p)
        lsm = torch.log_softmax(logits[i * req.num_samples, start : width - 1].float(), -1)
        target = torch.tensor(p[1:], device=lsm.device)
        full.append([0.0, *lsm.gather(-1, target[:, None]).squeeze(-1).cpu().tolist()])
        if req.topk_prompt:
            values, index = torch.topk(lsm, min(req.topk_prompt, lsm.shape[-1]), dim=-1)
            entries: list[dict[str, Any]] = [{"token_ids": [], "logprobs": []}]
            for v, ix in zip(values.cpu().tolist(), index.cpu().tolist(), strict=False):
                entries.append({"token_ids": ix, "logprobs": v})
            topk.append(entries)
    out: dict[str, Any] = {}
    if req.prompt_logprobs:
        out["prompt_logprobs"] = full
    if req.topk_prompt:
        out["topk_prompt_logprobs"] = topk
    return out
