"""`RestClient`: Tinker's REST calls (tinker 0.38's surface), over the Post-Training routes.

=================================================  ==========================================
Tinker call                                        Post-Training
=================================================  ==========================================
``list_checkpoints(training_run_id)``              ``GET sessions/{id}`` (it must exist), then
                                                   ``GET checkpoints?session_id=`` (the run is
                                                   the session: ``get_info().model_id``)
``list_user_checkpoints(limit, offset)``           ``GET checkpoints``, page by page (the
                                                   project's, newest first)
``get_training_run(training_run_id)``,             ``GET sessions/{id}`` and its checkpoints:
``get_training_run_by_tinker_path(path)``          base model, owner, LoRA rank, the last
                                                   training and sampler checkpoints
``list_training_runs(limit, offset)``              ``GET sessions``, page by page, newest first
                                                   (every session: a sampler's is one too)
``get_weights_info_by_tinker_path(path)``          ``GET checkpoints/{id}`` and its session's
                                                   LoRA config (every linear layer is adapted)
``get_external_weights_urls(tinker_path)``         ``GET checkpoints/{id}/download?variant=
                                                   CHECKPOINT_VARIANT_ADAPTER``: the adapter
                                                   and its config, renamed into Tinker's layout
                                                   (`tgnb.tinker._weights`), a ``file://`` URL
                                                   per file, as the cookbook's
                                                   ``weights.download`` fetches them
``set_checkpoint_ttl_from_tinker_path(p, ttl)``    ``GET checkpoints/{id}`` (it must exist);
                                                   checkpoints never expire, so a TTL is
                                                   ignored with a warning, as the SDK's
                                                   ``save_state(ttl_seconds=)`` does
``get_server_capabilities()``                      ``GET supported-models``
``get_telemetry()``                                ``None`` (no client telemetry)
=================================================  ==========================================

The rest of the surface is refused when called, one line saying what Post-Training lacks
(`REFUSED`): publishing, deleting or copying a checkpoint, one archive of a checkpoint, Tinker's
client sessions and sampler ids, the audit log, billing and storage reports, ``whoami``. Every
argument is checked before any request: a wrong type is a ``TypeError``, a wrong value a
`tgnb.errors.ValidationError`, each one line naming the fix. Every call answers an
already-resolved future (``.result()``, awaitable) and has its ``_async`` twin.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import functools
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinker import types

from tgnb.connection import of_sdk_keywords
from tgnb.errors import ValidationError
from tgnb.tinker._paths import (
    CKPT_TRAINING,
    KINDS,
    ParsedCheckpointTinkerPath,
    checkpoint_id,
    tinker_path,
)
from tgnb.tinker._support import Resolved
from tgnb.tinker._weights import fetch_in_tinker_layout

#: How long the URLs `get_external_weights_urls` answers are said to last. The API states no
#: expiry for its download URLs; a caller that renews URLs near their expiry (the cookbook's
#: ``weights.download``) asks again after this, so nothing is trusted longer than this.
URL_LIFETIME = datetime.timedelta(minutes=10)

_SESSIONS = (
    "Post-Training has no Tinker client sessions (a ServiceClient's heartbeat); its sessions are "
    "the training runs: get_training_run / list_training_runs"
)
_PUBLISHING = (
    "Post-Training checkpoints belong to their project; there is no publishing (share through "
    "the project instead)"
)
_ARCHIVE = (
    "Post-Training serves a checkpoint as separate files, not one archive: "
    "get_external_weights_urls(tinker_path) gives a URL for each"
)
_DELETE = "the Post-Training API has no checkpoint deletion"

#: Tinker's REST calls (tinker 0.38's, and 0.23.1's archive calls) that Post-Training cannot
#: serve, with why. Each is refused when called, as is its ``_async`` twin.
REFUSED: dict[str, str] = {
    "get_checkpoint_archive_url": _ARCHIVE,
    "get_checkpoint_archive_url_from_tinker_path": _ARCHIVE,
    "publish_checkpoint_from_tinker_path": _PUBLISHING,
    "unpublish_checkpoint_from_tinker_path": _PUBLISHING,
    "delete_checkpoint": _DELETE,
    "delete_checkpoint_from_tinker_path": _DELETE,
    "copy_weights": "Post-Training checkpoints stay in the project that took them: there is no "
    "copy to another project (train there with that project's key)",
    "get_session": _SESSIONS,
    "list_sessions": _SESSIONS,
    "search_sessions": _SESSIONS,
    "export_session_trace": _SESSIONS,
    "assign_session_project": _SESSIONS + "; a key's sessions are in its own project",
    "get_sampler": "tgnb's sampling clients have no sampler id: a sampler is a Post-Training "
    "session of its own (get_training_run on its session)",
    "get_audit_log": "the Post-Training API keeps no audit log",
    "get_billing_usage": "the Post-Training API reports no billing usage (tgnb's cost of a "
    "model resource: `tgnb pt usage`, %tg cost)",
    "get_current_checkpoint_storage_usage": "Post-Training checkpoints report no size",
    "whoami": "the Post-Training API does not say whom a key belongs to",
}

_SCOPES = ("owned", "accessible")


@dataclass(frozen=True)
class ExternalWeightsUrlsResponse:
    """Tinker 0.38's answer: a URL for each file name, and when the URLs expire."""

    urls: dict[str, str]
    expires: datetime.datetime


# ---- argument checks: one line naming the fix, before any request -----------------------------
def _text(call: str, name: str, value: Any, example: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"RestClient.{call}: {name} must be a string such as {example}, "
                        f"not {type(value).__name__}")  # fmt: skip
    if not value.strip():
        raise ValidationError(f"RestClient.{call}: {name} is empty: pass {example}")
    return value.strip()


def _run_id(call: str, value: Any) -> str:
    example = "training_client.get_info().model_id"
    run = _text(call, "training_run_id", value, example)
    if "/" in run:
        raise ValidationError(
            f"RestClient.{call}: {run!r} is a path, not a training run id: pass {example}, or "
            "ParsedCheckpointTinkerPath.from_tinker_path(path).training_run_id"
        )
    return run.split(":")[0]


def _path(call: str, value: Any) -> str:
    """The Post-Training checkpoint id of `value`, a ``tinker://`` path."""
    _text(call, "tinker_path", value, "the .path that save_state() or save_weights_for_sampler() "
          "returned")  # fmt: skip
    try:
        return checkpoint_id(value.strip())
    except ValidationError as exc:
        raise ValidationError(f"RestClient.{call}: {exc}") from None


def _count(call: str, name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"RestClient.{call}: {name} must be an integer, not {type(value).__name__}")
    if value < least:
        raise ValidationError(f"RestClient.{call}: {name} must be {least} or more, not {value}")
    return value


def _scope(call: str, value: Any) -> None:
    if value not in _SCOPES:
        raise ValidationError(
            f"RestClient.{call}: access_scope must be 'owned' or 'accessible', not {value!r} "
            "(a Post-Training key sees its project's: both list the same)"
        )


def _refuse(call: str, why: str) -> Any:
    def refused(self: RestClient, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"RestClient.{call}: {why}")

    refused.__name__ = refused.__qualname__ = call
    refused.__doc__ = f"Refused when called: {why}."
    return refused


class RestClient:
    """Tinker's ``RestClient`` on Post-Training (see the module docstring); made by
    ``ServiceClient.create_rest_client()`` or directly, as the cookbook does."""

    def __init__(
        self,
        _holder: Any = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        **unknown: Any,
    ) -> None:
        """`_holder` (tinker's internal client holder) is ignored: the connection is the SDK's
        ``base_url`` / ``api_key`` keywords, ``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY`` when
        left out. Any other keyword is refused, as tinker's own ``RestClient`` refuses it."""
        if unknown:
            raise TypeError(
                f"RestClient() takes base_url and api_key only, not {', '.join(sorted(unknown))}: "
                "drop it (the connection is TOGETHER_BASE_URL / TOGETHER_API_KEY when left out)"
            )
        for name, value in (("api_key", api_key), ("base_url", base_url)):
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"RestClient: {name} must be a string (or left out for "
                    f"TOGETHER_{name.upper()}), not {type(value).__name__}"
                )
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise ValidationError(
                f"RestClient: base_url {base_url!r} is not an http(s) URL: pass the API's root, "
                "such as https://api.together.xyz/v1, or leave it out"
            )
        self._conn = of_sdk_keywords(api_key, base_url)

    # ---- the API, page by page ---------------------------------------------------------------
    def _pages(self, listing: Any, enough: int | None = None, **query: Any) -> Iterator[Any]:
        """The items of a list route, page after page (``after``: the page's cursor), until
        `enough` are read or the last page."""
        read, after = 0, None
        while True:
            page = listing(limit=100, **query, **({"after": after} if after else {}))
            for item in page.data or []:
                yield item
                read += 1
            meta = getattr(page, "meta", None)
            after = getattr(meta, "next_cursor", None)
            if not getattr(meta, "has_more", False) or not after:
                return
            if enough is not None and read >= enough:
                return

    def _checkpoint(self, c: Any) -> types.Checkpoint:
        return types.Checkpoint(
            checkpoint_id=c.id,
            checkpoint_type=KINDS[str(c.type)][0],
            time=c.created_at,
            tinker_path=tinker_path(c.session_id, str(c.type), c.id),
        )

    def _checkpoints(self, enough: int | None = None, **query: Any) -> list[types.Checkpoint]:
        listing = self._conn.sdk().post_training.checkpoints.list
        return [self._checkpoint(c) for c in self._pages(listing, enough, **query)]

    def _training_run(self, session: Any) -> types.TrainingRun:
        listed = self._checkpoints(session_id=session.id)
        kinds = {kind: next((c for c in listed if c.checkpoint_type == kind), None)
                 for kind in ("training", "sampler")}  # fmt: skip
        lora = session.lora_config
        return types.TrainingRun(
            training_run_id=session.id,
            base_model=session.base_model,
            model_owner=session.created_by,
            is_lora=lora is not None,
            corrupted=str(session.status).endswith("_ERROR"),
            lora_rank=lora.rank if lora is not None else None,
            last_request_time=session.updated_at,
            last_checkpoint=kinds["training"],
            last_sampler_checkpoint=kinds["sampler"],
        )

    # ---- checkpoints ---------------------------------------------------------------------------
    def list_checkpoints(self, training_run_id: str) -> Resolved[types.CheckpointsListResponse]:
        """The checkpoints training run `training_run_id` (a session id) took, newest first; a
        run the project does not have is the SDK's ``NotFoundError``."""
        run = _run_id("list_checkpoints", training_run_id)
        self._conn.sdk().post_training.sessions.retrieve(run)
        return Resolved(
            types.CheckpointsListResponse(checkpoints=self._checkpoints(session_id=run))
        )

    def list_user_checkpoints(
        self, limit: int = 100, offset: int = 0
    ) -> Resolved[types.CheckpointsListResponse]:
        """The project's checkpoints, newest first: `limit` of them after skipping `offset`."""
        _count("list_user_checkpoints", "limit", limit, 1)
        _count("list_user_checkpoints", "offset", offset, 0)
        listed = self._checkpoints(enough=offset + limit)[offset : offset + limit]
        return Resolved(types.CheckpointsListResponse(checkpoints=listed))

    def get_external_weights_urls(self, tinker_path: str) -> Resolved[ExternalWeightsUrlsResponse]:
        """A URL for each file (the LoRA adapter in Tinker's layout, and its config) of the
        sampler or external weights at `tinker_path`: local files, kept until the process
        exits (fetched once per process: a checkpoint never changes)."""
        cid = _path("get_external_weights_urls", tinker_path)
        expires = datetime.datetime.now(datetime.UTC) + URL_LIFETIME
        client = self._conn.sdk()
        ckpt = client.post_training.checkpoints.retrieve(cid)
        if str(ckpt.type) == CKPT_TRAINING:
            raise NotImplementedError(
                f"{tinker_path} is a training checkpoint (weights and optimizer state) and "
                "Post-Training downloads sampler weights only: download the path that "
                "save_weights_for_sampler() returned"
            )
        files = client.post_training.checkpoints.download(
            cid, variant="CHECKPOINT_VARIANT_ADAPTER"
        ).data
        folder = _downloads() / cid
        names = {f.filename: folder / Path(f.filename).name for f in files}
        if not all(p.is_file() for p in names.values()):
            names = fetch_in_tinker_layout({f.filename: f.url for f in files}, folder)
        urls = {name: path.as_uri() for name, path in names.items()}
        return Resolved(ExternalWeightsUrlsResponse(urls, expires))

    def set_checkpoint_ttl_from_tinker_path(
        self, tinker_path: str, ttl_seconds: int | None
    ) -> Resolved[None]:
        """``ttl_seconds=None`` (keep it indefinitely) is what every Post-Training checkpoint
        is; a TTL is ignored with a warning (the checkpoint must exist either way)."""
        call = "set_checkpoint_ttl_from_tinker_path"
        cid = _path(call, tinker_path)
        if ttl_seconds is not None:
            _count(call, "ttl_seconds", ttl_seconds, 1)
        self._conn.sdk().post_training.checkpoints.retrieve(cid)
        if ttl_seconds is not None:
            warnings.warn(
                "Together ignores ttl_seconds: Post-Training checkpoints have no TTL, they are "
                "kept until the project removes them",
                stacklevel=2,
            )
        return Resolved(None)

    def get_weights_info_by_tinker_path(
        self, tinker_path: str
    ) -> Resolved[types.WeightsInfoResponse]:
        """The base model and LoRA shape of the weights at `tinker_path` (Post-Training adapts
        every linear layer: ``train_mlp`` and ``train_attn`` are True)."""
        cid = _path("get_weights_info_by_tinker_path", tinker_path)
        pt = self._conn.sdk().post_training
        ckpt = pt.checkpoints.retrieve(cid)
        lora = pt.sessions.retrieve(ckpt.session_id).lora_config
        return Resolved(
            types.WeightsInfoResponse(
                base_model=ckpt.base_model,
                is_lora=lora is not None,
                lora_rank=lora.rank if lora is not None else None,
                train_unembed=getattr(lora, "train_unembed", None),
                train_mlp=True,
                train_attn=True,
            )
        )

    # ---- training runs -------------------------------------------------------------------------
    def get_training_run(
        self, training_run_id: str, access_scope: str = "owned"
    ) -> Resolved[types.TrainingRun]:
        """Training run `training_run_id` (a session id): its base model, owner, LoRA rank and
        last checkpoints; one the project does not have is the SDK's ``NotFoundError``."""
        run = _run_id("get_training_run", training_run_id)
        _scope("get_training_run", access_scope)
        session = self._conn.sdk().post_training.sessions.retrieve(run)
        return Resolved(self._training_run(session))

    def get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: str = "owned"
    ) -> Resolved[types.TrainingRun]:
        """The training run that saved `tinker_path` (a ``tinker://`` path)."""
        call = "get_training_run_by_tinker_path"
        _path(call, tinker_path)
        _scope(call, access_scope)
        try:
            run = ParsedCheckpointTinkerPath.from_tinker_path(tinker_path.strip()).training_run_id
        except ValueError:
            raise ValidationError(
                f"RestClient.{call}: {tinker_path!r} names no training run: pass a "
                "tinker://<run>/... path that a save returned"
            ) from None
        return self.get_training_run(run, access_scope)

    def list_training_runs(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: str = "owned",
        project_id: str | None = None,
    ) -> Resolved[types.TrainingRunsResponse]:
        """The project's training runs (its sessions), newest first: `limit` of them after
        skipping `offset`. A key sees its own project's only: `project_id` must be None."""
        call = "list_training_runs"
        _count(call, "limit", limit, 1)
        _count(call, "offset", offset, 0)
        _scope(call, access_scope)
        if project_id is not None:
            raise ValidationError(
                f"RestClient.{call}: a Post-Training key lists its own project's runs: leave "
                "project_id out, or make the client with that project's key"
            )
        sessions = list(self._pages(self._conn.sdk().post_training.sessions.list))
        sessions.sort(key=lambda s: s.created_at, reverse=True)
        runs = [self._training_run(s) for s in sessions[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(sessions))
        return Resolved(types.TrainingRunsResponse(training_runs=runs, cursor=cursor))

    # ---- the service ---------------------------------------------------------------------------
    def get_server_capabilities(self) -> Resolved[types.GetServerCapabilitiesResponse]:
        """The base models ``GET /v1/rl/supported-models`` lists, with their context length."""
        models = []
        for m in self._conn.sdk().post_training.supported_models.get().data:
            generators = [c.generator_config for c in (m.compute_configs or [])]
            lengths = [g.context_length for g in generators if g and g.context_length]
            length = int(max(lengths)) if lengths else None
            models.append(types.SupportedModel(model_name=m.base_model, max_context_length=length))
        return Resolved(types.GetServerCapabilitiesResponse(supported_models=models))

    def get_telemetry(self) -> None:
        """Tinker's client telemetry has no Post-Training counterpart: always ``None``."""
        return None

    def __getattr__(self, name: str) -> Any:
        """A REST call of a tinker newer than this table (on the installed tinker's
        ``RestClient``): refused when called, saying so."""
        if name.startswith("_") or not hasattr(genuine_rest_client(), name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return functools.partial(
            _refuse(name, "Tinker's REST call has no Post-Training counterpart"), self
        )


#: The calls served, each with an ``_async`` twin.
SERVED = (
    "list_checkpoints",
    "list_user_checkpoints",
    "get_external_weights_urls",
    "set_checkpoint_ttl_from_tinker_path",
    "get_weights_info_by_tinker_path",
    "get_training_run",
    "get_training_run_by_tinker_path",
    "list_training_runs",
    "get_server_capabilities",
)


def _twin(name: str) -> Any:
    method = getattr(RestClient, name)

    async def twin(self: RestClient, *args: Any, **kwargs: Any) -> Any:
        return await (await asyncio.to_thread(method, self, *args, **kwargs)).result_async()

    functools.update_wrapper(twin, method)
    twin.__name__ = twin.__qualname__ = f"{name}_async"
    return twin


for _name in SERVED:
    setattr(RestClient, f"{_name}_async", _twin(_name))
for _name, _why in REFUSED.items():
    setattr(RestClient, _name, _refuse(_name, _why))
    setattr(RestClient, f"{_name}_async", _refuse(f"{_name}_async", _why))


@functools.cache
def _downloads() -> Path:
    """This process's folder for adapters renamed into Tinker's layout (a folder per
    checkpoint), removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="tgnb-tinker-weights-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def genuine_rest_client() -> type:
    from tinker.lib.public_interfaces.rest_client import RestClient as Genuine

    return Genuine
