"""`TrainingClient`: the SDK layer's trainer plus the calls Tinker scripts make that it lacks.

- ``forward_backward`` returns ``loss_fn_outputs`` (per-token logprobs) by default, as Tinker
  does, at every position, zero-weight ones included (`_outputs`: a scoring pass fills them);
  ``forward`` / ``forward_backward`` send Tinker's own loss defaults (`TINKER_LOSS_DEFAULTS`).
- ``get_info`` / ``get_tokenizer``: read from the session's record (``GET training-sessions/{id}``).
- ``load_state`` / ``load_state_with_optimizer``: the API loads a checkpoint only into a new
  session (``resume_from_checkpoint_id``, ``load_optimizer``), so the client opens one on its
  own resource with the checkpoint's LoRA config, then stops the session it replaces (first,
  when the resource holds its cap of sessions: the new one takes its slot). Work submitted
  before the load should be collected first (``.result()``), as on Tinker.
- ``save_state`` / ``save_weights_for_sampler`` answer Tinker's ``tinker://`` paths (`_paths`);
  ``save_weights_for_sampler`` takes a training checkpoint and an inference checkpoint at the
  same step and answers the inference one's path (downloadable, deployable); the training one
  is what lets ``create_sampling_client(model_path=...)`` serve that path.
- ``create_sampling_client(model_path)``: a sampler on a session of its own, on the service
  client's shared resources (`_pool`, `_sampling`).
- ``save_weights_and_get_sampling_client`` answers this package's `SamplingClient`; the first
  one moves the session from its generator-less resource onto one with a generator (`_pool`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from together.post_training import ModelResourcesClient
from together.post_training.tinker import TrainingClient as _SdkTrainingClient
from together.post_training.tinker import types

from tgnb.connection import Endpoint, of_sdk_keywords
from tgnb.tinker._losses import CLIENT_LOSSES, ClientLosses, refuse_unserved
from tgnb.tinker._mapped import Mapped
from tgnb.tinker._metadata import check as check_metadata
from tgnb.tinker._metadata import keeper
from tgnb.tinker._newer import console_url, no_stability_info, optimizer_params, sampler_kind
from tgnb.tinker._offloop import ClientFuture, serve_sync_calls
from tgnb.tinker._outputs import excluded, filled, scoring_data
from tgnb.tinker._paths import EXTERNAL, with_path
from tgnb.tinker._pool import MAX_SESSIONS, ResourcePool
from tgnb.tinker._sampling import SamplingClient, open_sampler
from tgnb.tinker._support import (
    POLL_INTERVAL,
    Release,
    Resolved,
    Then,
    load_tokenizer,
    lora_of,
    training_state,
    with_tinker_defaults,
)


def _open_sessions(conn: Endpoint, resource_id: str) -> int:
    """The sessions open (creating or running) on resource `resource_id`, as the API lists them."""
    page = conn.sdk().post_training.sessions.list(
        model_resources_id=resource_id,
        status=["TRAINING_SESSION_STATUS_CREATING", "TRAINING_SESSION_STATUS_RUNNING"],
        limit=100,
    )
    return len(page.data or [])


def _no_encryption(recipients: list[str] | None) -> None:
    if recipients:
        raise NotImplementedError(
            "age_encryption_recipients: Post-Training serves checkpoint files as they are, over "
            "signed URLs, and cannot encrypt them to a key; save without it"
        )


@serve_sync_calls(
    waits=(
        "get_info",
        "forward_backward_custom",
        "create_sampling_client",
        "save_weights_and_get_sampling_client",
        "close",
    ),
    submits=(
        "forward",
        "forward_backward",
        "optim_step",
        "save_state",
        "save_weights_for_sampler",
        "save_weights_external",
        "load_state",
        "load_state_with_optimizer",
    ),
)
@dataclass
class TrainingClient(ClientFuture, ClientLosses, _SdkTrainingClient):
    """One LoRA training session, driven the Tinker way (see the module docstring)."""

    _conn: Endpoint = field(default_factory=of_sdk_keywords, repr=False)
    _pool: ResourcePool | None = field(default=None, repr=False)  # its service client's

    # -- losses: Tinker's outputs and defaults ------------------------------------------------
    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
        *,
        return_loss_fn_outputs: bool = True,
    ) -> Any:
        if loss_fn in CLIENT_LOSSES:
            return self._client_loss(data, loss_fn_config, backward=False)
        refuse_unserved(loss_fn)
        holes = excluded(data) if return_loss_fn_outputs else None
        scored = super().forward(scoring_data(data), "cross_entropy") if holes else None
        future = super().forward(
            data,
            loss_fn,
            with_tinker_defaults(loss_fn, loss_fn_config),
            return_loss_fn_outputs=return_loss_fn_outputs,
        )
        return future if holes is None else Mapped(partial(filled, holes), future, scored)

    async def forward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
        *,
        return_loss_fn_outputs: bool = True,
    ) -> Any:
        if loss_fn in CLIENT_LOSSES:
            return await self._client_loss_async(data, loss_fn_config, backward=False)
        refuse_unserved(loss_fn)
        holes = excluded(data) if return_loss_fn_outputs else None
        scored = await super().forward_async(scoring_data(data), "cross_entropy") if holes else None
        future = await super().forward_async(
            data,
            loss_fn,
            with_tinker_defaults(loss_fn, loss_fn_config),
            return_loss_fn_outputs=return_loss_fn_outputs,
        )
        return future if holes is None else Mapped(partial(filled, holes), future, scored)

    def forward_backward(  # type: ignore[override]
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
        *,
        return_loss_fn_outputs: bool = True,
    ) -> Any:
        if loss_fn in CLIENT_LOSSES:
            return self._client_loss(data, loss_fn_config, backward=True)
        refuse_unserved(loss_fn)
        holes = excluded(data) if return_loss_fn_outputs else None
        scored = super().forward(scoring_data(data), "cross_entropy") if holes else None
        future = super().forward_backward(
            data,
            loss_fn,
            with_tinker_defaults(loss_fn, loss_fn_config),
            return_loss_fn_outputs=return_loss_fn_outputs,
        )
        return future if holes is None else Mapped(partial(filled, holes), future, scored)

    async def forward_backward_async(  # type: ignore[override]
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
        *,
        return_loss_fn_outputs: bool = True,
    ) -> Any:
        if loss_fn in CLIENT_LOSSES:
            return await self._client_loss_async(data, loss_fn_config, backward=True)
        refuse_unserved(loss_fn)
        holes = excluded(data) if return_loss_fn_outputs else None
        scored = await super().forward_async(scoring_data(data), "cross_entropy") if holes else None
        future = await super().forward_backward_async(
            data,
            loss_fn,
            with_tinker_defaults(loss_fn, loss_fn_config),
            return_loss_fn_outputs=return_loss_fn_outputs,
        )
        return future if holes is None else Mapped(partial(filled, holes), future, scored)

    # -- what the model is ---------------------------------------------------------------------
    def get_info(self) -> types.GetInfoResponse:
        record = self._session.retrieve()
        lora = lora_of(record)
        return types.GetInfoResponse(
            model_id=record.id,
            model_name=record.base_model,
            is_lora=bool(lora),
            lora_rank=lora.get("rank"),
            model_data=types.ModelData(model_name=record.base_model),
        )

    async def get_info_async(self) -> types.GetInfoResponse:
        return await asyncio.to_thread(self.get_info)

    def get_tokenizer(self) -> Any:
        info = self.get_info()
        assert info.model_name is not None
        return load_tokenizer(info.model_name)

    def get_telemetry(self) -> None:
        """Tinker's client telemetry has no Post-Training counterpart: always ``None``."""
        return None

    def get_console_url(self) -> str:
        """Post-Training has no console page per run: the session's API record's URL."""
        return console_url(self._conn, f"training-sessions/{self._session.session_id}")

    def optim_step(  # type: ignore[override]
        self, optim_params: Any = None, *, adam_params: types.AdamParams | None = None
    ) -> Any:
        return super().optim_step(optimizer_params(optim_params, adam_params))

    async def optim_step_async(  # type: ignore[override]
        self, optim_params: Any = None, *, adam_params: types.AdamParams | None = None
    ) -> Any:
        return await super().optim_step_async(optimizer_params(optim_params, adam_params))

    # -- loading state -------------------------------------------------------------------------
    def load_state(self, path: str, weights_access_token: str | None = None) -> Any:
        """Load the weights of training checkpoint `path` (the optimizer starts afresh)."""
        return self._load(path, weights_access_token, load_optimizer=False)

    async def load_state_async(self, path: str, weights_access_token: str | None = None) -> Any:
        return await asyncio.to_thread(self.load_state, path, weights_access_token)

    def load_state_with_optimizer(self, path: str, weights_access_token: str | None = None) -> Any:
        """Load the weights and the optimizer state of training checkpoint `path`."""
        return self._load(path, weights_access_token, load_optimizer=True)

    async def load_state_with_optimizer_async(
        self, path: str, weights_access_token: str | None = None
    ) -> Any:
        return await asyncio.to_thread(self.load_state_with_optimizer, path, weights_access_token)

    def _load(self, path: str, token: str | None, *, load_optimizer: bool) -> Any:
        if token is not None:
            raise NotImplementedError("Post-Training has no weights_access_token; drop it")
        state = training_state(self._conn, path)
        old = self._session
        record = old.retrieve()
        if record.base_model != state.base_model:
            raise ValueError(
                f"checkpoint {path} is of {state.base_model!r}, this client trains "
                f"{record.base_model!r}: open a client with "
                "ServiceClient().create_training_client_from_state(path) instead"
            )
        mr = ModelResourcesClient.attach(
            model_resources_id=record.resources_id, **self._conn.native()
        )
        try:
            if _open_sessions(self._conn, record.resources_id) >= MAX_SESSIONS:
                self._end_session(old)  # at the cap the new one needs this one's slot
            new = mr.create_session(
                lora_config=state.lora_config,  # type: ignore[arg-type]
                resume_from_checkpoint_id=state.checkpoint_id,
                load_optimizer=load_optimizer,
                interval=POLL_INTERVAL,
            )
        finally:
            mr.detach()
        self._session = new
        self._published_weights = type(self._published_weights)()
        if isinstance(self._lifecycle, Release):  # always, for clients this package opened
            self._lifecycle.add(f"session {new.session_id}", new.stop, first=True)
        self._end_session(old)
        return Resolved(types.LoadWeightsResponse(path=path))

    def _end_session(self, session: Any) -> None:
        """Stop `session` (once) and drop its handle from what the client gives back."""
        if isinstance(self._lifecycle, Release):
            self._lifecycle.release(f"session {session.session_id}")
        else:
            session.stop()

    # -- saving and sampling -------------------------------------------------------------------
    def _as_path(self, kind: str, future: Any) -> Mapped[Any]:
        return Mapped(partial(with_path, self._session.session_id, kind), future)

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> Any:
        """Tinker's ``save_state``; `user_metadata` is kept on this machine (`_metadata`)."""
        keep = keeper(self._conn, check_metadata(user_metadata))
        future = self._as_path("weights", super().save_state(name, ttl_seconds, overwrite))
        return Mapped(keep, future)

    async def save_state_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> Any:
        keep = keeper(self._conn, check_metadata(user_metadata))
        future = await super().save_state_async(name, ttl_seconds, overwrite)
        return Mapped(keep, self._as_path("weights", future))

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None, user_metadata: dict[str, str] | None = None
    ) -> Any:
        keep = keeper(self._conn, check_metadata(user_metadata))
        return Mapped(keep, self._inference_checkpoint(name, ttl_seconds, "sampler_weights"))

    async def save_weights_for_sampler_async(
        self, name: str, ttl_seconds: int | None = None, user_metadata: dict[str, str] | None = None
    ) -> Any:
        keep = keeper(self._conn, check_metadata(user_metadata))
        future = await asyncio.to_thread(
            self._inference_checkpoint, name, ttl_seconds, "sampler_weights"
        )
        return Mapped(keep, future)

    def _inference_checkpoint(self, name: str, ttl_seconds: int | None, kind: str) -> Any:
        """A training and an inference checkpoint at this step; the inference one's path."""
        state = super().save_state(name, ttl_seconds)
        sampler = super().save_weights_for_sampler(name, ttl_seconds)
        return Then(state, self._as_path(kind, sampler))

    def save_weights_external(
        self,
        name: str,
        ttl_seconds: int | None = None,
        age_encryption_recipients: list[str] | None = None,
    ) -> Any:
        """Tinker 0.38's weights for use elsewhere: an inference checkpoint, as
        ``save_weights_for_sampler`` takes one, at ``tinker://<run>/external_weights/<id>``, its
        files' URLs from ``RestClient.get_external_weights_urls``."""
        _no_encryption(age_encryption_recipients)
        return self._inference_checkpoint(name, ttl_seconds, EXTERNAL)

    async def save_weights_external_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        age_encryption_recipients: list[str] | None = None,
    ) -> Any:
        _no_encryption(age_encryption_recipients)
        return await asyncio.to_thread(self._inference_checkpoint, name, ttl_seconds, EXTERNAL)

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
        **kwargs: Any,
    ) -> SamplingClient:
        """A client of the weights now trained (see `tgnb.tinker._newer.sampler_kind`)."""
        # `name` is deprecated on Tinker ("has no effect"), so it is not passed on to be warned about
        no_stability_info(record_stability_info)
        sampler_kind(kind)
        self._onto_a_generator()
        sdk = super().save_weights_and_get_sampling_client(None, retry_config, **kwargs)
        return SamplingClient.wrap(sdk, None)

    async def save_weights_and_get_sampling_client_async(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
        **kwargs: Any,
    ) -> SamplingClient:
        no_stability_info(record_stability_info)
        sampler_kind(kind)
        await asyncio.to_thread(self._onto_a_generator)
        sdk = await super().save_weights_and_get_sampling_client_async(None, retry_config, **kwargs)
        return SamplingClient.wrap(sdk, None)

    def _onto_a_generator(self) -> None:
        """Training starts on a resource with no generator (`_pool`); before its first sampler,
        move the session onto one that has: a training checkpoint (weights and optimizer), a
        session resumed from it there, the old session given back (and its resource, if last)."""
        if self._pool is None:
            return
        record = self._session.retrieve()
        if self._pool.generators(record.resources_id) != 0:
            return
        ckpt = super().save_state("").result()  # after everything submitted before (FIFO)
        session, release = self._pool.open(
            record.base_model,
            lora_of(record),
            sampling=True,
            resume_from_checkpoint_id=ckpt.path,
            load_optimizer=True,
        )
        old, self._lifecycle = self._lifecycle, release  # type: ignore[assignment]
        self._session = session
        self._published_weights = type(self._published_weights)()
        if old is not None:
            old.close()

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> SamplingClient:
        """A sampler on the weights saved at `model_path` (a session of its own)."""
        no_stability_info(record_stability_info)
        pool = self._pool or ResourcePool(self._conn)
        return open_sampler(self._conn, pool, model_path=model_path, base_model=None)

    async def create_sampling_client_async(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> SamplingClient:
        return await asyncio.to_thread(
            self.create_sampling_client, model_path, retry_config, record_stability_info
        )
