"""`SamplingClient`: the SDK layer's sampler plus ``get_tokenizer`` / ``get_base_model`` (and
their ``_async`` twins), ``close``, and sampling clients opened on saved weights or a base model.

Post-Training samples only inside a training session, from the weights that session published
(``weights-sync``). So a sampling client for saved weights is a session of its own, opened from
the training checkpoint on the service client's shared resources (`_pool`: no resource of its
own), with its weights published once; for a base model, a fresh LoRA session (its adapter
starts at zero, so it samples the base model). Such a client owns that session: ``close()``
gives it back, as does the interpreter's exit, and so does dropping the client (a script that
opens a sampler per evaluation and never closes one, as Tinker allows, holds no more sessions
than it still uses): the futures a client answered keep it alive until they are read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from together.post_training.tinker import SamplingClient as _SdkSamplingClient
from together.post_training.tinker import types

from tgnb.connection import Endpoint
from tgnb.tinker._mapped import Mapped
from tgnb.tinker._newer import identified
from tgnb.tinker._offloop import ClientFuture, serve_sync_calls
from tgnb.tinker._pool import ResourcePool
from tgnb.tinker._sample import Request, Sampled, check_last_n, submit
from tgnb.tinker._stops import cut_at_stops, split_stops
from tgnb.tinker._support import (
    Release,
    load_tokenizer,
    release_later,
    training_state,
)

#: The adapter a base-model sampling session carries (rank 1, zero-initialised: the base model).
BASE_SAMPLER_LORA: dict[str, Any] = {"rank": 1}


@serve_sync_calls(waits=("get_base_model", "close"), submits=("sample", "compute_logprobs"))
@dataclass(frozen=True)
class SamplingClient(ClientFuture, _SdkSamplingClient):
    """Samples from one session's published weights (see the module docstring)."""

    _base_model: str | None = None
    _release: Release | None = field(default=None, repr=False, compare=False)

    @classmethod
    def wrap(cls, sdk: _SdkSamplingClient, base_model: str | None) -> SamplingClient:
        """This class over the same session as a sampler the SDK's layer made."""
        state = {f.name: getattr(sdk, f.name) for f in dataclasses.fields(sdk) if f.init}
        return cls(**state, _base_model=base_model)

    # -- sampling: token-id stops honoured (`tgnb.tinker._stops`), Tinker 0.38's sequence ids
    # (`tgnb.tinker._newer`) ----------------------------------------------------------------
    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: Any = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> Any:
        """Tinker 0.38's ``sample`` (`tgnb.tinker._sample`: what is supplied on the client)."""
        request, finish = self._request(
            prompt,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs,
            target_prompt_logprobs,
            prompt_alt_tokens_k,
            prompt_logprobs_last_n,
        )
        first = self._session.run(self._submit(request, num_samples))
        return self._kept(Sampled(self._session, request, first, finish))

    def _request(
        self, prompt: types.ModelInput, sampling_params: types.SamplingParams, *options: Any
    ) -> tuple[Request, Callable[..., Any]]:
        """One ``sample`` call's request (its token-id stops cut on the client) and what makes
        Tinker's response of the service's."""
        self._check_fresh()
        params, ids = split_stops(sampling_params)
        return Request.of(prompt, params, *options), functools.partial(_as_tinker, ids=ids)

    async def sample_async(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: Any = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> types.SampleResponse:
        request, finish = self._request(
            prompt,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs,
            target_prompt_logprobs,
            prompt_alt_tokens_k,
            prompt_logprobs_last_n,
        )
        first = await self._submit(request, num_samples)
        return await Sampled(self._session, request, first, finish)

    def _submit(self, request: Request, num_samples: int) -> Any:
        return submit(
            self._session,
            request.wire_input,
            request.wire_params,
            num_samples=num_samples,
            prompt_logprobs=request.prompt_logprobs,
            topk=request.topk_prompt,
        )

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> Any:
        """The prompt's logprobs (``None`` first); with `prompt_logprobs_last_n`, ``None`` but
        for its last n (the whole prompt is scored: the API scores no part of one)."""
        check_last_n(prompt, prompt_logprobs_last_n, True)
        future = super().compute_logprobs(prompt)
        return self._kept(Mapped(functools.partial(_last, prompt_logprobs_last_n), future))

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        check_last_n(prompt, prompt_logprobs_last_n, True)
        return _last(prompt_logprobs_last_n, await super().compute_logprobs_async(prompt))

    def _kept(self, future: Any) -> Any:
        """`future`, holding this client (and so its session) until it is read, when the client
        owns a session that dropping it would give back."""
        return future if self._release is None else Mapped(functools.partial(_owned, self), future)

    def get_base_model(self) -> str:
        """The base model this client samples (read from its session's record)."""
        if self._base_model is None:
            object.__setattr__(self, "_base_model", self._session.retrieve().base_model)
        assert self._base_model is not None
        return self._base_model

    async def get_base_model_async(self) -> str:
        return await asyncio.to_thread(self.get_base_model)

    def get_tokenizer(self) -> Any:
        """The base model's tokenizer (`tgnb.tinker._support.load_tokenizer`: no Hub retries
        for a model that is already local)."""
        return load_tokenizer(self.get_base_model())

    @classmethod
    def create(cls, holder: Any, **kwargs: Any) -> Any:
        """Tinker's holder-based constructor: refused (see the error)."""
        raise NotImplementedError(
            "SamplingClient.create takes Tinker's internal client holder, which Post-Training "
            "has no counterpart of: use ServiceClient().create_sampling_client(...)"
        )

    @staticmethod
    def from_sampler_handle(handle: str, *, api_key: str | None = None) -> Any:
        """Tinker 0.38's sampler handed between processes: refused (see the error)."""
        raise NotImplementedError(
            "from_sampler_handle: a Post-Training sampler is its training session and is not "
            "handed to another process; open one there with create_sampling_client(model_path)"
        )

    def get_sampler_handle(self) -> str:
        """Tinker 0.38's handle of this sampler for another process: refused (see the error)."""
        raise NotImplementedError(
            "get_sampler_handle: a Post-Training sampler is its training session and is not "
            "handed to another process; save_weights_for_sampler() and pass that path instead"
        )

    def on_queue_state_change(self, queue_state: Any, queue_state_reason: str | None) -> None:
        """Tinker's hook for its request queue's state: Post-Training reports none, so it is
        never called here; calling it does nothing."""

    def get_telemetry(self) -> None:
        """Tinker's client telemetry has no Post-Training counterpart: always ``None``."""
        return None

    def close(self) -> None:
        """Stop the session (and resource) this client opened; a no-op for a trainer's sampler."""
        if self._release is not None:
            self._release.close()

    async def close_async(self) -> None:
        if self._release is not None:
            await self._release.aclose()


def _owned(client: SamplingClient, result: Any) -> Any:
    return result


def open_sampler(
    conn: Endpoint, pool: ResourcePool, *, model_path: str | None, base_model: str | None
) -> SamplingClient:
    """A sampling client on a session of its own, on `pool`'s resources: from `model_path`'s
    weights, else `base_model`."""
    if model_path is None and base_model is None:
        raise ValueError("Either model_path or base_model must be provided")
    resume: dict[str, Any] = {}
    lora = dict(BASE_SAMPLER_LORA)
    if model_path is not None:
        state = training_state(conn, model_path)
        base_model, lora = state.base_model, state.lora_config
        resume = {"resume_from_checkpoint_id": state.checkpoint_id, "load_optimizer": False}
    assert base_model is not None
    session, release = pool.open(base_model, lora, sampling=True, **resume)
    try:
        session.trainer.weights_sync()
    except BaseException:
        release.close(automatic=True)
        raise
    client = SamplingClient(session, _base_model=base_model, _release=release)
    weakref.finalize(client, release_later, release).atexit = False  # exit: Release's hook
    return client


def _last(n: int | None, logprobs: list[float | None]) -> list[float | None]:
    none: list[float | None] = [None] * (len(logprobs) - n) if n is not None else []
    return logprobs if n is None else none + logprobs[-n:]


def _as_tinker(response: types.SampleResponse, ids: frozenset[int]) -> types.SampleResponse:
    """A sample's response as Tinker answers it: cut at its token-id stops, each sequence with
    its ``sequence_id``."""
    return identified(cut_at_stops(response, ids) if ids else response)
