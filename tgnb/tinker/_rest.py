"""`RestClient`: Tinker's checkpoint management, over the Post-Training checkpoint routes.

=================================================  ==========================================
Tinker call                                        Post-Training
=================================================  ==========================================
``list_checkpoints(training_run_id)``              ``GET checkpoints?session_id=`` (the run
                                                   is the session: ``get_info().model_id``)
``list_user_checkpoints(limit, offset)``           ``GET checkpoints`` (the project's, newest
                                                   first)
``get_external_weights_urls(tinker_path)``         ``GET checkpoints/{id}/download?variant=
  (Tinker 0.38; a sampler or external path)          CHECKPOINT_VARIANT_ADAPTER``: the adapter
                                                   and its config (PEFT's), fetched and renamed
                                                   into Tinker's layout (`tgnb.tinker._weights`:
                                                   the output layer's LoRA is
                                                   ``unembed_tokens``); a ``file://`` URL per
                                                   file, as the cookbook's ``weights.download``
                                                   fetches them (``urlretrieve``)
``set_checkpoint_ttl_from_tinker_path(p, ttl)``    ``GET checkpoints/{id}`` (it must exist);
                                                   checkpoints never expire, so a TTL is
                                                   ignored with a warning, as the SDK's
                                                   ``save_state(ttl_seconds=)`` does
=================================================  ==========================================

What Post-Training cannot do is refused when called, with why: publishing, deleting a
checkpoint, one archive of a checkpoint (it serves each file at its own URL), downloading a
training checkpoint (weights and optimizer state: the API downloads inference checkpoints only),
and Tinker's other REST calls (training runs, sessions, samplers, audit log). Every call answers
an already-resolved future (``.result()``) and has its ``_async`` twin.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import functools
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from together.post_training.tinker import types

from tgnb.connection import of_sdk_keywords
from tgnb.tinker._paths import CKPT_TRAINING, KINDS, checkpoint_id, tinker_path
from tgnb.tinker._support import Resolved
from tgnb.tinker._weights import fetch_in_tinker_layout

#: How long the URLs `get_external_weights_urls` answers are said to last. The API states no
#: expiry for its download URLs; a caller that renews URLs near their expiry (the cookbook's
#: ``weights.download``) asks again after this, so nothing is trusted longer than this.
URL_LIFETIME = datetime.timedelta(minutes=10)

_TINKER_ONLY = {
    "get_checkpoint_archive_url": "Post-Training serves a checkpoint as separate files, not one "
    "archive: get_external_weights_urls(tinker_path) gives a URL for each",
    "publish_checkpoint": "Post-Training checkpoints belong to their project; there is no "
    "publishing (share through the project instead)",
    "unpublish_checkpoint": "Post-Training checkpoints belong to their project; there is no "
    "publishing",
    "delete_checkpoint": "the Post-Training API has no checkpoint deletion",
}


@dataclass(frozen=True)
class ExternalWeightsUrlsResponse:
    """Tinker 0.38's answer: a URL for each file name, and when the URLs expire."""

    urls: dict[str, str]
    expires: datetime.datetime


def _refuse(call: str) -> Any:
    key = next((k for k in _TINKER_ONLY if call.startswith(k)), "")
    why = _TINKER_ONLY.get(key) or "Tinker's REST call has no Post-Training counterpart"

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"RestClient.{call}: {why}")

    return refused


class RestClient:
    """Tinker's ``RestClient`` on Post-Training (see the module docstring); made by
    ``ServiceClient.create_rest_client()`` or directly, as the cookbook does."""

    def __init__(
        self, *, base_url: str | None = None, api_key: str | None = None, **_: Any
    ) -> None:
        self._conn = of_sdk_keywords(api_key, base_url)

    def _checkpoints(self, **query: Any) -> types.CheckpointsListResponse:
        listed = self._conn.sdk().post_training.checkpoints.list(**query).data or []
        return types.CheckpointsListResponse(
            checkpoints=[
                types.Checkpoint(
                    checkpoint_id=c.id,
                    checkpoint_type=KINDS[str(c.type)][0],
                    time=c.created_at,
                    tinker_path=tinker_path(c.session_id, str(c.type), c.id),
                )
                for c in listed
            ]
        )

    def list_checkpoints(self, training_run_id: str) -> Resolved[types.CheckpointsListResponse]:
        """The checkpoints training run `training_run_id` (a session id) took, newest first."""
        return Resolved(self._checkpoints(session_id=training_run_id.split(":")[0]))

    def list_user_checkpoints(
        self, limit: int = 100, offset: int = 0
    ) -> Resolved[types.CheckpointsListResponse]:
        """The project's checkpoints, newest first (`offset` skips that many; the API's page
        holds 100 at most)."""
        listed = self._checkpoints(limit=min(100, offset + limit))
        return Resolved(types.CheckpointsListResponse(checkpoints=listed.checkpoints[offset:]))

    def get_external_weights_urls(self, tinker_path: str) -> Resolved[ExternalWeightsUrlsResponse]:
        """A URL for each file (the LoRA adapter in Tinker's layout, and its config) of the
        sampler or external weights at `tinker_path`: local files, kept until the process
        exits (fetched once per process: a checkpoint never changes)."""
        cid = checkpoint_id(tinker_path)
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
        self._conn.sdk().post_training.checkpoints.retrieve(checkpoint_id(tinker_path))
        if ttl_seconds is not None:
            warnings.warn(
                "Together ignores ttl_seconds: Post-Training checkpoints have no TTL, they are "
                "kept until the project removes them",
                stacklevel=2,
            )
        return Resolved(None)

    def __getattr__(self, name: str) -> Any:
        """Tinker's other REST calls, refused when called (with why); ``_async`` twins of the
        calls above."""
        if name.endswith("_async") and name.removesuffix("_async") in _SERVED:
            method = getattr(self, name.removesuffix("_async"))

            async def twin(*args: Any, **kwargs: Any) -> Any:
                return await (await asyncio.to_thread(method, *args, **kwargs)).result_async()

            return functools.wraps(method)(twin)
        if name.startswith("_") or not hasattr(_genuine_rest_client(), name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return _refuse(name.removesuffix("_async"))


_SERVED = {
    "list_checkpoints",
    "list_user_checkpoints",
    "get_external_weights_urls",
    "set_checkpoint_ttl_from_tinker_path",
}


@functools.cache
def _downloads() -> Path:
    """This process's folder for adapters renamed into Tinker's layout (a folder per
    checkpoint), removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="tgnb-tinker-weights-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def _genuine_rest_client() -> type:
    from tinker.lib.public_interfaces.rest_client import RestClient as Genuine

    return Genuine
