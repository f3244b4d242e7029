"""`ServiceClient`: the SDK layer's service client, opening this package's clients, plus
``create_sampling_client``, ``get_server_capabilities`` and every ``_async`` twin.

Clients it opens share its model resources (`_pool`: one per base model up to the session cap,
or the ``model_resources_id`` given), and give back their session on ``close()`` or at the
interpreter's exit; a resource stops with its last session.
Resuming from a checkpoint opens the session with the LoRA config of the session that wrote it
(rank, alpha, seed, ...): the adapter must have the same shape and the API reads the config.

Making one names, on stderr, every model resource an earlier tgnb process created on the same
endpoint that is still active while that process is gone (`tgnb.ptregistry.find`: what it has
cost so far, and ``tgnb pt stop --leftovers`` to stop them), and sets the SIGTERM / SIGINT
handlers that stop what the script holds (`_signals`).
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import Any

from together.post_training.tinker import ServiceClient as _SdkServiceClient
from together.post_training.tinker import types

from tgnb import ptregistry
from tgnb.connection import Endpoint, of_sdk_keywords, with_home_emulator
from tgnb.tinker._newer import console_url, no_stability_info, optimizer_config
from tgnb.tinker._offloop import run_sync, serve_sync_calls
from tgnb.tinker._pool import ResourcePool
from tgnb.tinker._rest import RestClient
from tgnb.tinker._sampling import SamplingClient, open_sampler
from tgnb.tinker._signals import install as install_signal_handlers
from tgnb.tinker._support import Resolved, log, training_state
from tgnb.tinker._training import TrainingClient


def _ignored_train_options(train_mlp: bool, train_attn: bool) -> None:
    off = [n for n, on in (("train_mlp", train_mlp), ("train_attn", train_attn)) if not on]
    if off:
        raise ValueError(
            f"Post-Training adapts every linear layer: {', '.join(off)}=False cannot be honoured; "
            "leave them True (train_unembed is supported)"
        )


def say_leftovers(conn: Endpoint) -> None:
    """The leftovers of `conn`'s endpoint, on stderr (nothing when there are none; a failure to
    ask is logged, never the script's failure)."""
    try:
        found = ptregistry.find(with_home_emulator(conn))
    except Exception as exc:
        log.warning("could not check for model resources left running: %r", exc)
        return
    for line in ptregistry.lines(found, prefix="tgnb.tinker"):
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            return


def _close_all(clients: list[Any]) -> None:
    for client in clients:
        client.close()


@serve_sync_calls(
    waits=(
        "create_lora_training_client",
        "create_training_client_from_state",
        "create_training_client_from_state_with_optimizer",
        "create_sampling_client",
        "get_server_capabilities",
    )
)
class ServiceClient(_SdkServiceClient):
    """Entry point of a Tinker script on Post-Training (see `tgnb.tinker`)."""

    def __init__(
        self,
        user_metadata: dict[str, str] | None = None,
        project_id: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        model_resources_id: str | None = None,
        display_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`display_name` (Tinker's name for the session in its console) has no Post-Training
        counterpart: it is kept as ``display_name`` and sent nowhere. `project_id` is refused:
        Post-Training's routes take no project (the API key's is used)."""
        if project_id is not None:
            raise NotImplementedError(
                f"project_id={project_id!r}: Post-Training's routes take no project, the API "
                "key's own is used; use a key of that project (TOGETHER_API_KEY) and drop it"
            )
        super().__init__(
            user_metadata,
            project_id,
            base_url=base_url,
            api_key=api_key,
            model_resources_id=model_resources_id,
            **kwargs,
        )
        self._conn = of_sdk_keywords(api_key, base_url)
        self._pool = ResourcePool(self._conn, model_resources_id)
        install_signal_handlers()
        say_leftovers(self._conn)
        self.display_name = display_name
        self._opened: list[TrainingClient] = []
        self._samplers: list[weakref.ref[SamplingClient]] = []  # a dropped one gives itself back

    def __enter__(self) -> ServiceClient:
        return self

    def close(self, status: str = "success", detail: str | None = None) -> Resolved[None]:
        """Tinker 0.38's end of a service client: as leaving its ``with`` block (`status`, what
        Tinker records of the run, has nowhere to go on Post-Training)."""
        self.__exit__()
        return Resolved(None)

    def __exit__(self, *exc: object) -> None:
        """Leaving ``with ServiceClient() as service_client:`` ends what it opened, as on Tinker
        (where the block's end closes the session): each client it created is closed, off a
        running event loop without a warning (the block is how the cookbook's trainers end)."""
        samplers = [s for ref in self._samplers if (s := ref()) is not None]
        opened, self._opened, self._samplers = [*self._opened, *samplers], [], []
        run_sync("ServiceClient.__exit__", _close_all, opened, warn=False)

    # -- training clients ----------------------------------------------------------------------
    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: Any = None,
    ) -> TrainingClient:
        """Tinker's; `optimizer` AdamW only (`_newer.optimizer_config`)."""
        _ignored_train_options(train_mlp, train_attn)
        optimizer_config(optimizer)
        lora: dict[str, Any] = {"rank": rank}
        if seed is not None:
            lora["seed"] = seed
        if not train_unembed:
            lora["train_unembed"] = False
        return self._open(base_model, lora)

    async def create_lora_training_client_async(  # type: ignore[override]
        self, base_model: str, rank: int = 32, seed: int | None = None, **kwargs: Any
    ) -> TrainingClient:
        return await asyncio.to_thread(
            self.create_lora_training_client, base_model, rank, seed, **kwargs
        )

    def create_training_client_from_state(  # type: ignore[override]
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: Any = None,
    ) -> TrainingClient:
        """A new client with the weights of training checkpoint `path` (fresh optimizer).
        Tinker 0.38's `base_model`, when given, must be the checkpoint's."""
        optimizer_config(optimizer)
        return self._from_state(path, weights_access_token, load_optimizer=False, base=base_model)

    async def create_training_client_from_state_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: Any = None,
    ) -> TrainingClient:
        return await asyncio.to_thread(
            self.create_training_client_from_state,
            path,
            base_model,
            user_metadata,
            weights_access_token,
            optimizer,
        )

    def create_training_client_from_state_with_optimizer(  # type: ignore[override]
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> TrainingClient:
        """A new client with the weights and optimizer state of training checkpoint `path`."""
        return self._from_state(path, weights_access_token, load_optimizer=True, base=base_model)

    async def create_training_client_from_state_with_optimizer_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> TrainingClient:
        return await asyncio.to_thread(
            self.create_training_client_from_state_with_optimizer,
            path,
            base_model,
            user_metadata,
            weights_access_token,
        )

    def _from_state(
        self, path: str, token: str | None, *, load_optimizer: bool, base: str | None = None
    ) -> TrainingClient:
        if token is not None:
            raise NotImplementedError("Post-Training has no weights_access_token; drop it")
        state = training_state(self._conn, path)
        if isinstance(base, dict):  # tinker 0.23 took user_metadata second
            base = None
        if base is not None and base != state.base_model:
            raise ValueError(
                f"checkpoint {path} is of {state.base_model!r}, not base_model={base!r}: drop "
                "base_model or name the checkpoint's"
            )
        return self._open(
            state.base_model,
            state.lora_config,
            resume_from_checkpoint_id=state.checkpoint_id,
            load_optimizer=load_optimizer,
        )

    def _open(self, base_model: str, lora: dict[str, Any], **resume: Any) -> TrainingClient:
        session, release = self._pool.open(base_model, lora, sampling=False, **resume)
        # the SDK's client closes whatever `_lifecycle` it is given; this one owns both handles
        client = TrainingClient(session, release, _conn=self._conn, _pool=self._pool)  # type: ignore[arg-type]
        self._opened.append(client)
        return client

    # -- sampling clients and capabilities -----------------------------------------------------
    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> SamplingClient:
        """A sampler on saved weights (`model_path`, from ``save_state`` or
        ``save_weights_for_sampler``) or on `base_model`; it owns a session (see `_sampling`)."""
        no_stability_info(record_stability_info)
        sampler = open_sampler(self._conn, self._pool, model_path=model_path, base_model=base_model)
        self._samplers = [*(r for r in self._samplers if r() is not None), weakref.ref(sampler)]
        return sampler

    async def create_sampling_client_async(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> SamplingClient:
        return await asyncio.to_thread(
            self.create_sampling_client, model_path, base_model, retry_config, record_stability_info
        )

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The base models ``GET /v1/rl/supported-models`` lists, with their context length."""
        listed = self._conn.sdk().post_training.supported_models.get().data
        models = []
        for m in listed:
            generators = [c.generator_config for c in (m.compute_configs or [])]
            lengths = [g.context_length for g in generators if g and g.context_length]
            models.append(
                types.SupportedModel(
                    model_name=m.base_model,
                    max_context_length=int(max(lengths)) if lengths else None,
                )
            )
        return types.GetServerCapabilitiesResponse(supported_models=models)

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return await asyncio.to_thread(self.get_server_capabilities)

    def create_rest_client(self) -> RestClient:  # type: ignore[override]
        """Tinker's checkpoint management on the same connection (`tgnb.tinker._rest`)."""
        return RestClient(**self._conn.native())

    def copy_weights(
        self, path: str, *, ttl_seconds: int | None = None, weights_access_token: str | None = None
    ) -> Any:
        """Tinker 0.38's copy of a checkpoint into this account: refused (see the error)."""
        raise NotImplementedError(
            "copy_weights: Post-Training copies no checkpoint; every call that takes a path "
            "reads it where it is (create_training_client_from_state(path))"
        )

    def create_custom_loss(self, fn: Any, input_ranks: Any) -> Any:
        """Tinker 0.38's server-side custom loss: refused (see the error)."""
        raise NotImplementedError(
            "create_custom_loss: Post-Training runs no user loss on the service; pass the "
            "function to TrainingClient.forward_backward_custom(data, loss_fn) instead"
        )

    @property
    def holder(self) -> Any:
        """Tinker's internal client holder: this layer has none (see the error)."""
        raise NotImplementedError(
            "ServiceClient.holder is Tinker's internal connection to its own service; "
            "tgnb.tinker talks to Post-Training through the together SDK and has none"
        )

    def get_console_url(self) -> str:
        """Post-Training has no console page: the URL of the API's model resources list."""
        return console_url(self._conn, "model-resources")

    def get_telemetry(self) -> None:
        """Tinker's client telemetry has no Post-Training counterpart: always ``None``."""
        return None
