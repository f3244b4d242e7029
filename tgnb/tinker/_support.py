"""What the Tinker layer's clients share: the lifecycle of what they open, the
tokenizer, Tinker's loss defaults, checkpoint lookups and already-resolved futures.

Every remote call goes through the ``together`` SDK's public clients (``Together``,
``ModelResourcesClient``, ``SessionClient``) on Post-Training API routes only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tgnb.errors import ValidationError
from tgnb.tinker._paths import CKPT_TRAINING, checkpoint_id

if TYPE_CHECKING:
    from tgnb.connection import Endpoint

T = TypeVar("T")
log = logging.getLogger("tgnb.tinker")

#: Seconds between status polls while a resource or session comes up (the SDK's default is 10 s;
#: a poll a second costs the service little and saves up to 9 s per client).
POLL_INTERVAL = 1.0

#: Tinker's own defaults for the losses that take parameters (tinker docs, "Loss functions"):
#: PPO clips the ratio to [0.8, 1.2]; CISPO to [0.0, 4.0]. Together documents none, so the Tinker
#: layer sends them explicitly and a Tinker script computes what it computed on Tinker.
TINKER_LOSS_DEFAULTS: dict[str, dict[str, float]] = {
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
}


def with_tinker_defaults(
    loss_fn: str, config: Mapping[str, float] | None
) -> dict[str, float] | None:
    """`config` completed with Tinker's defaults for `loss_fn` (what the user set wins)."""
    merged = {**TINKER_LOSS_DEFAULTS.get(loss_fn, {}), **(config or {})}
    return merged or None


class Release:
    """Gives back, in order, what a client opened (sessions first, then a resource).

    A handle is dropped once its stop succeeded, so a failed close can be retried and the
    interpreter-exit fallback still sees what is left. Registered with ``threading``'s exit
    hooks (as the SDK's own layer does), which run before ``concurrent.futures`` shuts the
    SDK's HTTP executor down; an ordinary ``atexit`` hook would run too late.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[str, Callable[[], Any]]] = []
        self._lock = threading.Lock()
        threading._register_atexit(functools.partial(self.close, automatic=True))  # type: ignore[attr-defined]

    @property
    def closed(self) -> bool:
        return not self._pending

    def add(self, label: str, stop: Callable[[], Any], *, first: bool = False) -> None:
        with self._lock:
            if first:
                self._pending.insert(0, (label, stop))
            else:
                self._pending.append((label, stop))

    def release(self, label: str) -> None:
        """Stop and drop the handle named `label` now (e.g. the session a load replaced)."""
        with self._lock:
            found = [h for h in self._pending if h[0] == label]
            self._pending = [h for h in self._pending if h[0] != label]
        for _, stop in found:
            stop()

    def close(self, *, automatic: bool = False) -> None:
        failures: list[BaseException] = []
        with self._lock:
            pending, self._pending = self._pending, []
        survivors = []
        for label, stop in pending:
            try:
                stop()
            except BaseException as exc:  # a Ctrl-C in one stop must not skip the GPUs behind it
                log.error("stopping %s failed: %r", label, exc)
                failures.append(exc)
                survivors.append((label, stop))
        with self._lock:
            self._pending = survivors + self._pending
        if failures and not automatic:
            raise failures[0]

    async def aclose(self, *, automatic: bool = False) -> None:
        await asyncio.to_thread(self.close, automatic=automatic)


@functools.cache
def _releaser() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tgnb-tinker-release")


def release_later(release: Release) -> None:
    """Give back what a dropped client held, on a thread of its own: HTTP calls never run inside
    the garbage collector, which may fire in the middle of another call."""
    if not release.closed:
        _releaser().submit(release.close, automatic=True)


def wait_for_releases(timeout: float | None = None) -> None:
    """Return once every release queued by `release_later` so far has run (at once, with no
    thread started, when none ever was)."""
    if _releaser.cache_info().currsize:
        _releaser().submit(lambda: None).result(timeout=timeout)


class Resolved(Generic[T]):
    """A future whose value is already there (Tinker's ``APIFuture`` surface: ``result()``,
    ``result_async()``, ``await``)."""

    def __init__(self, value: T) -> None:
        self._value = value

    def result(self, timeout: float | None = None) -> T:
        return self._value

    async def result_async(self, timeout: float | None = None) -> T:
        return self._value

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()


class Then(Generic[T]):
    """Two submitted operations as one future: waits for `first`, then answers `second`'s."""

    def __init__(self, first: Any, second: Any) -> None:
        self._first, self._second = first, second

    def result(self, timeout: float | None = None) -> T:
        self._first.result(timeout=timeout)
        return self._second.result(timeout=timeout)

    async def result_async(self, timeout: float | None = None) -> T:
        await self._first.result_async(timeout=timeout)
        return await self._second.result_async(timeout=timeout)

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()


@dataclass(frozen=True)
class TrainingState:
    """A training checkpoint to open a session from, with the LoRA config of the session that
    wrote it (a resumed session must use the same adapter shape, seed included)."""

    checkpoint_id: str
    base_model: str
    lora_config: dict[str, Any]


def lora_of(session: Any) -> dict[str, Any]:
    """A session record's LoRA config as ``create_session`` takes it (unset keys left out)."""
    raw = getattr(session, "lora_config", None)
    if raw is None:
        return {}
    out: dict[str, Any] = {}
    for key in ("rank", "alpha", "dropout", "seed", "train_unembed"):
        value = getattr(raw, key, None)
        if value is not None:
            out[key] = int(value) if key in ("rank", "seed") else value
    return out


def training_state(conn: Endpoint, path: str) -> TrainingState:
    """The training checkpoint behind `path` (a ``tinker://`` path or a bare id, `_paths`): a
    ``save_state`` path as is; a ``save_weights_for_sampler`` path (an inference checkpoint)
    through the training checkpoint its session took at the same step
    (`TrainingClient.save_weights_for_sampler` takes both)."""
    cid = checkpoint_id(path)
    client = conn.sdk()
    ckpt = client.post_training.checkpoints.retrieve(cid)
    session = client.post_training.sessions.retrieve(ckpt.session_id)
    if str(ckpt.type) == CKPT_TRAINING:
        return TrainingState(ckpt.id, ckpt.base_model, lora_of(session))
    same_step = [c for c in session.training_checkpoints if int(c.step) == int(ckpt.step)]
    if not same_step:
        raise ValidationError(
            f"checkpoint {path} holds weights for download and deployment only: the API "
            "cannot load an inference checkpoint into a session, and its session took no "
            f"training checkpoint at step {int(ckpt.step)}; sample from a save_state() path, "
            "or save with tgnb.tinker's save_weights_for_sampler, which takes both"
        )
    return TrainingState(same_step[-1].id, ckpt.base_model, lora_of(session))


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Any:
    """The tokenizer of base model `name`, with no Hub round trip when it is already local.

    In order: a local model directory (a served ``base_model`` may be a path); the Hugging Face
    cache with ``local_files_only`` (no request at all, so no retry loop when offline; the
    emulator lists the tiny model by its snapshot directory there and accepts ``tgnb/tiny-llama``
    as its alias); the built-in tiny model's
    tokenizer, built in memory, when its name is asked and the cache lacks it; else the Hub.
    """
    from transformers import AutoTokenizer

    name = name.split(":")[0]
    local = Path(name).expanduser()
    if local.is_dir():
        return AutoTokenizer.from_pretrained(str(local))
    from huggingface_hub import try_to_load_from_cache

    try:  # a cache lookup that sends nothing (a miss inside from_pretrained still calls the Hub)
        cached = try_to_load_from_cache(name, "tokenizer_config.json")
    except ValueError:  # not shaped like a repo id
        cached = None
    if isinstance(cached, str):
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    from tgnb.tasks.assets import TINY_NAME, build_tokenizer

    if name == TINY_NAME:
        return build_tokenizer()
    return AutoTokenizer.from_pretrained(name)
