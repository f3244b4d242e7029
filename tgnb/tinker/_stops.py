"""Token-id stop sequences, honoured as Tinker honours them.

Tinker's ``SamplingParams.stop`` takes strings or token ids (the cookbook's qwen3, llama3,
deepseek, kimi and gpt_oss renderers stop on ids); the Post-Training API's ``stop`` carries
strings only, and the SDK's layer drops ids with a warning. This layer sends the string stops
and ends each sequence itself at its first stop token: the stop token is kept as the last token
(Tinker's renderers expect it there exactly once), what was sampled after it is dropped with its
logprobs, and ``stop_reason`` is ``"stop"``. Sampling is autoregressive, so a sequence cut at its
first stop token is distributed exactly as one the sampler stopped there; the service may still
compute the tokens past it, up to ``max_tokens``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from together.post_training.tinker import types

from tgnb.tinker._compat import sampled_sequence


def split_stops(params: types.SamplingParams) -> tuple[types.SamplingParams, frozenset[int]]:
    """`params` with only its string stops, and the token ids it stops on."""
    stop = params.stop
    if stop is None or isinstance(stop, str):
        return params, frozenset()
    ids = frozenset(int(s) for s in stop if not isinstance(s, str))
    if not ids:
        return params, ids
    strings = [s for s in stop if isinstance(s, str)]
    return params.model_copy(update={"stop": strings or None}), ids


def cut_at_stops(response: types.SampleResponse, ids: Collection[int]) -> types.SampleResponse:
    """Each sequence of `response` ended at (and including) its first token in `ids`."""
    sequences = []
    for seq in response.sequences:
        tokens = seq.tokens
        end = next((i + 1 for i, t in enumerate(tokens) if t in ids), None)
        if end is None:
            sequences.append(seq)
            continue
        logprobs = seq.logprobs
        sequences.append(
            sampled_sequence(
                stop_reason="stop",
                _tokens_list=list(tokens[:end]),
                _logprobs_list=None if logprobs is None else list(logprobs[:end]),
            )
        )
    return dataclasses.replace(response, sequences=sequences)
