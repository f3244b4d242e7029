"""``SamplingClient.sample`` / ``compute_logprobs`` as tinker 0.38 takes and answers them, on
Post-Training's ``sample`` operation (the SDK's submission), with tinker's own types.

What the API has no field for is supplied here, on the client:

- ``topk_sample_logprobs=k``: the API returns top-k alternatives for *prompt* positions only, so
  each sampled sequence is scored once more, as the prompt followed by its tokens, with
  ``topk_prompt_logprobs=k``: its rows at the sampled positions are the top-k of the same
  weights there (one more request per sequence; at most 20, the API's top-k cap).
- ``prompt_logprobs_last_n=n``: the whole prompt is scored and the entries before its last `n`
  answered ``None`` (top-k rows masked), as Tinker answers them; the cost is the whole prompt's.

Refused, with what Post-Training lacks: ``target_prompt_logprobs`` and ``prompt_alt_tokens_k``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from together.post_training import SamplingParams as WireSamplingParams
from together.post_training._futures import OperationFuture
from together.post_training._payloads import resolve_operation_payload
from together.post_training.clients.generator import _submit_sample_batch
from together.post_training.tinker import types
from together.post_training.tinker._converters import (
    _TOPK_MASK_LOGPROB,
    _prompt_logprobs,
    _stop_reason,
    _to_model_input,
)
from together.post_training.tinker._sampling import _to_sample_request

from tgnb.tinker._compat import TINKER_VERSION, has_field, sampled_sequence, topk_class

#: The API's cap on ``topk_prompt_logprobs`` (and so on ``topk_sample_logprobs`` here).
MAX_TOPK = 20


@dataclass(frozen=True)
class Request:
    """One ``sample`` call's arguments, checked before anything is sent."""

    prompt: Any
    wire_input: Any
    wire_params: Any
    prompt_logprobs: bool
    topk_prompt: int
    topk_sample: int
    last_n: int | None

    @classmethod
    def of(
        cls,
        prompt: Any,
        sampling_params: Any,
        include_prompt_logprobs: bool,
        topk_prompt_logprobs: int,
        topk_sample_logprobs: int,
        target_prompt_logprobs: Any,
        prompt_alt_tokens_k: int,
        prompt_logprobs_last_n: int | None,
    ) -> Request:
        if target_prompt_logprobs is not None:
            raise NotImplementedError(
                "target_prompt_logprobs: Post-Training's sample operation scores the prompt's own "
                "tokens only; drop it and read prompt_logprobs (or topk_prompt_logprobs)"
            )
        if prompt_alt_tokens_k:
            raise NotImplementedError(
                "prompt_alt_tokens_k: Post-Training draws no alternative prompt tokens; drop it "
                "and read topk_prompt_logprobs instead"
            )
        if not 0 <= topk_sample_logprobs <= MAX_TOPK:
            raise ValueError(f"topk_sample_logprobs must be between 0 and {MAX_TOPK}")
        if topk_sample_logprobs and not has_field(types.SampledSequence, "topk_logprobs_np"):
            raise TypeError(
                f"topk_sample_logprobs needs tinker >= 0.38 (installed: {TINKER_VERSION}): "
                "pip install -U tinker"
            )
        check_last_n(prompt, prompt_logprobs_last_n, include_prompt_logprobs, topk_prompt_logprobs)
        wire_input, wire_params = _to_sample_request(prompt, sampling_params, topk_prompt_logprobs)
        return cls(
            prompt,
            wire_input,
            wire_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs,
            prompt_logprobs_last_n,
        )


def check_last_n(prompt: Any, last_n: int | None, prompt_logprobs: bool, topk: int = 0) -> None:
    """Tinker's rule for ``prompt_logprobs_last_n``: with prompt logprobs, 1 to len - 1."""
    if last_n is None:
        return
    if not (prompt_logprobs or topk):
        raise ValueError(
            "prompt_logprobs_last_n needs include_prompt_logprobs=True (or topk_prompt_logprobs)"
        )
    if not 1 <= last_n <= prompt.length - 1:
        raise ValueError(
            f"prompt_logprobs_last_n must be between 1 and len(prompt) - 1 = {prompt.length - 1}, "
            f"got {last_n}"
        )


async def submit(
    session: Any,
    wire_input: Any,
    params: Any,
    *,
    num_samples: int,
    prompt_logprobs: bool,
    topk: int,
) -> OperationFuture[Any]:
    """POST one sample operation; its future answers the API's result for the one prompt."""
    operation = await session.run_async(
        _submit_sample_batch(
            session,
            model_inputs=[wire_input],
            num_samples=num_samples,
            sampling_params=params,
            prompt_logprobs=prompt_logprobs,
            topk_prompt_logprobs=topk,
        )
    )
    return OperationFuture(session, operation, partial(_first_result, session=session))


async def _first_result(completed: Any, *, session: Any) -> Any:
    resolved = await resolve_operation_payload(completed, session=session)
    return resolved.results[0]


def topk_rows(rows: list[Any] | None, width: int) -> Any:
    """The API's top-k lists as tinker's dense matrices (masked where a row is short)."""
    if rows is None:
        return None
    ids = np.zeros((len(rows), width), dtype=np.int32)
    logprobs = np.full((len(rows), width), _TOPK_MASK_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        row_ids, row_lps = list(row.token_ids or []), list(row.logprobs or [])
        count = min(width, len(row_ids), len(row_lps))
        ids[i, :count] = row_ids[:count]
        logprobs[i, :count] = row_lps[:count]
    return topk_class()(token_ids=ids, logprobs=logprobs)


def response(result: Any, request: Request) -> Any:
    """The API's result as the installed tinker's ``SampleResponse``."""
    sequences = [
        sampled_sequence(
            stop_reason=_stop_reason(seq.stop_reason),
            tokens_np=np.asarray([int(t) for t in seq.tokens], dtype=np.int32),
            logprobs_np=None if seq.logprobs is None else np.asarray(seq.logprobs, np.float32),
        )
        for seq in result.sequences
    ]
    answer = types.SampleResponse(
        sequences=sequences,
        prompt_logprobs_np=_prompt_logprobs(result),
        topk_prompt_logprobs_np=topk_rows(result.topk_prompt_logprobs, request.topk_prompt),
        prompt_cache_hit_tokens=result.sequences[0].prompt_cache_hit_tokens
        if result.sequences
        else 0,
    )
    return answer if request.last_n is None else _last_n(answer, request.last_n)


def _last_n(answer: Any, n: int) -> Any:
    """`answer` with the prompt entries before its last `n` unscored, as Tinker answers them."""
    lps, topk = answer.prompt_logprobs_np, answer.topk_prompt_logprobs_np
    if lps is not None:
        lps = lps.copy()
        lps[: len(lps) - n] = np.nan
    if topk is not None:
        ids, values = topk.token_ids.copy(), topk.logprobs.copy()
        ids[: len(ids) - n], values[: len(values) - n] = 0, _TOPK_MASK_LOGPROB
        topk = type(topk)(token_ids=ids, logprobs=values)
    return dataclasses.replace(answer, prompt_logprobs_np=lps, topk_prompt_logprobs_np=topk)


#: A scoring pass: one token, so the operation is mostly its prompt's logprobs.
SCORE_PARAMS = WireSamplingParams(max_tokens=1)


def _score(session: Any, request: Request, seq: Any) -> Any:
    """Submit the pass that scores `seq`'s sampled positions: the prompt, then its tokens."""
    tokens = [*request.prompt.to_ints(), *(int(t) for t in seq.tokens)]
    wire = _to_model_input(types.ModelInput.from_ints(tokens))
    return submit(
        session, wire, SCORE_PARAMS, num_samples=1, prompt_logprobs=False, topk=request.topk_sample
    )


def _with_rows(answer: Any, request: Request, scored: list[Any]) -> Any:
    """`answer` with each sequence's top-k rows at its sampled positions, from its scoring pass."""
    start = request.prompt.length
    sequences = []
    for seq, result in zip(answer.sequences, scored, strict=True):
        rows = (result.topk_prompt_logprobs or [])[start : start + len(seq.tokens)]
        rows_np = topk_rows(rows, request.topk_sample)
        sequences.append(dataclasses.replace(seq, topk_logprobs_np=rows_np))
    return dataclasses.replace(answer, sequences=sequences)


class Sampled:
    """A ``sample`` call's future (Tinker's ``APIFuture`` surface): the sample as tinker's
    response, `finish`ed (token-id stops, sequence ids), then, for ``topk_sample_logprobs``, one
    scoring pass per sequence."""

    def __init__(self, session: Any, request: Request, first: Any, finish: Any) -> None:
        self._session, self._request, self._first, self._finish = session, request, first, finish

    def result(self, timeout: float | None = None) -> Any:
        answer = self._finish(response(self._first.result(timeout=timeout), self._request))
        if not self._request.topk_sample:
            return answer
        passes = [
            self._session.run(_score(self._session, self._request, s)) for s in answer.sequences
        ]
        return _with_rows(answer, self._request, [p.result(timeout=timeout) for p in passes])

    async def result_async(self, timeout: float | None = None) -> Any:
        first = await self._first.result_async(timeout=timeout)
        answer = self._finish(response(first, self._request))
        if not self._request.topk_sample:
            return answer
        passes = [await _score(self._session, self._request, s) for s in answer.sequences]
        scored = [await p.result_async(timeout=timeout) for p in passes]
        return _with_rows(answer, self._request, scored)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result_async().__await__()
