"""Synchronous calls made inside a running event loop, served as Tinker serves them.

On Tinker a synchronous call made from ``async def`` code works: Tinker's work runs on its own
background loop while the caller's thread waits, and the calls that wait for a result
(``get_tokenizer()``, ``create_sampling_client()``, ``future.result()``, ...) log Tinker's
warning, "Synchronous method 'X()' called from async context. ..." (tinker 0.23.1 goes on "Use
'X_async()' instead", 0.38, whose ``_async`` twins are deprecated, "await the future instead":
`sync_from_async` answers the installed tinker's own), with the calling stack; calls that only submit work (``forward``, ``optim_step``, ``sample``, ...)
say nothing. The SDK's layer refuses every one of them instead (``RuntimeError: blocking calls
cannot be used from a running event loop``), which stops the docs' async pipeline pattern and
the cookbook's ``rl/train.py``.

`serve_sync_calls` makes this package's clients behave as Tinker's: inside a running loop (not
a notebook's, where the SDK already blocks as in a script), the call runs on a worker thread,
where the SDK drives its own loop as usual, while the caller's thread waits for it; the calls
that wait for a result log Tinker's warning (logger ``tgnb.tinker``). Futures the clients
answer (`OffLoopFuture`) do the same for ``result()``. ``get_tokenizer()`` is not wrapped: as
on Tinker, it asks the server through a wrapped call (``get_info`` / ``get_base_model``, whose
name the warning gives) and loads the tokenizer on the caller's thread.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import logging
import traceback
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from together.post_training._loop import _process_loop, blocking_would_stall_caller

C = TypeVar("C", bound=type)
log = logging.getLogger("tgnb.tinker")


@functools.cache
def _workers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="tgnb-tinker-sync")


@functools.cache
def _waiters() -> ThreadPoolExecutor:
    """Threads that wait on results for ``APIFuture.future()`` (apart from `_workers`, whose
    calls may themselves wait on these)."""
    return ThreadPoolExecutor(max_workers=16, thread_name_prefix="tgnb-tinker-future")


def run_sync(label: str, fn: Callable[..., Any], *args: Any, warn: bool, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, off the caller's running event loop if there is one.

    On the SDK's own loop thread it runs in place (blocking there would deadlock, and the SDK
    says so)."""
    if not blocking_would_stall_caller() or _process_loop.owns_running_loop():
        return fn(*args, **kwargs)
    if warn:  # the installed tinker's message (tinker.lib.sync_only), then its stack
        log.warning(sync_from_async(label))
        log.warning(
            "===== Stack for calling sync from async ===== \n%s\n ===========",
            "".join(traceback.format_stack()[:-1]),
        )
    context = contextvars.copy_context()
    return _workers().submit(context.run, functools.partial(fn, *args, **kwargs)).result()


def sync_from_async(label: str) -> str:
    """What the installed tinker logs for `label` (``Class.method``) called inside a running
    loop: tinker 0.23.1 says to use its ``_async`` twin, 0.38 (whose twins are deprecated) to
    await the future instead."""
    owner, _, name = label.rpartition(".")
    try:
        from tinker.lib.sync_only import make_error_message
    except ImportError:  # a tinker without it: its 0.38 wording
        return (
            f"Synchronous method '{label}()' called from async context. It blocks the event "
            "loop until the result arrives; await the future instead."
        )

    def method() -> None: ...

    method.__name__ = name
    return make_error_message(method, (type(owner, (), {})(),) if owner else (), {})


class OffLoopFuture:
    """A submitted call's future (``result()``, ``result_async()``, ``await``) whose ``result()``
    also works inside a running loop, with Tinker's warning; anything else is the inner one's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._concurrent: concurrent.futures.Future[Any] | None = None

    def result(self, timeout: float | None = None) -> Any:
        return run_sync("APIFuture.result", self._inner.result, timeout=timeout, warn=True)

    async def result_async(self, timeout: float | None = None) -> Any:
        return await self._inner.result_async(timeout=timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result_async().__await__()

    async def coroutine(self) -> Any:
        """Tinker 0.38's: this future as a coroutine (for ``asyncio.create_task`` and the like)."""
        return await self

    def future(self) -> concurrent.futures.Future[Any]:
        """Tinker 0.38's: a ``concurrent.futures.Future`` of the result (for ``wait``,
        ``as_completed``, ``add_done_callback``), answered by a waiter thread. Cancelling it
        before the result is there stops nothing on the service: Post-Training cancels no
        submitted operation."""
        if self._concurrent is None:
            self._concurrent = _waiters().submit(self._inner.result)
        return self._concurrent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ClientFuture:
    """A client that is also its own resolved future. Since Tinker 0.38 ``ServiceClient``'s
    ``create_*`` methods (and ``save_weights_and_get_sampling_client``) answer a future of the
    client that can be used as the client too (its ``BackcompatClientFuture``): the cookbook
    writes ``await service_client.create_lora_training_client(...)``, older code uses the answer
    directly. This package's clients are both: ``await``, ``result()``, ``result_async()``
    answer the client itself."""

    def result(self, timeout: float | None = None) -> Any:
        return self

    async def result_async(self, timeout: float | None = None) -> Any:
        return self

    def future(self) -> concurrent.futures.Future[Any]:
        """Tinker 0.38's ``concurrent.futures.Future`` of the client: already done."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        done.set_result(self)
        return done

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result_async().__await__()


def _future(value: Any) -> Any:
    if hasattr(value, "result_async") and not isinstance(value, (OffLoopFuture, ClientFuture)):
        return OffLoopFuture(value)
    return value


def _sync(cls: type, name: str, warn: bool) -> Callable[..., Any]:
    method = getattr(cls, name)
    label = f"{cls.__name__}.{name}"

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _future(run_sync(label, method, self, *args, warn=warn, **kwargs))

    return call


def _async(cls: type, name: str) -> Callable[..., Any]:
    method = getattr(cls, name)

    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _future(await method(self, *args, **kwargs))

    return call


def serve_sync_calls(*, waits: Iterable[str] = (), submits: Iterable[str] = ()) -> Callable[[C], C]:
    """Class decorator: the named sync methods work inside a running loop (`run_sync`); those
    in `waits` log Tinker's warning there. Futures they (and the ``_async`` twins of `submits`)
    answer are `OffLoopFuture`s."""

    def decorate(cls: C) -> C:
        for name in waits:
            setattr(cls, name, _sync(cls, name, warn=True))
        for name in submits:
            setattr(cls, name, _sync(cls, name, warn=False))
            if hasattr(cls, f"{name}_async"):
                setattr(cls, f"{name}_async", _async(cls, f"{name}_async"))
        return cls

    return decorate
