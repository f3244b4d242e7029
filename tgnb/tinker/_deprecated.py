"""The installed tinker's deprecations, warned on this layer's clients as tinker warns them.

Since tinker 0.38 every plain call answers a future that can be awaited (``await
training_client.forward_backward(...)``, ``await service_client.create_lora_training_client(...)``),
and the ``_async`` twins (with a few plain calls: ``load_state``, ``create_rest_client``,
``ServiceClient.get_server_capabilities``, ...) are marked deprecated with ``typing_extensions``'
``@deprecated``: calling one warns (``FutureWarning``, "DEPRECATED: TrainingClient.forward_async()
is deprecated and will be removed in a future tinker SDK version. Use ...") and then works as
before. Tinker 0.23.1 deprecates none of them.

`warn_as_tinker_does` reads the marks off the *installed* tinker's classes, so this layer warns
exactly where the user's own tinker would: nothing with 0.23.1, tinker's own message and category
at the caller's line with 0.38 (and with a later release, whatever it marks). A call the layer makes
itself (from ``tgnb.tinker`` or the SDK's layer, or while a deprecated call runs) never warns.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Coroutine
from typing import Any

#: Set while a deprecated call runs: what it calls in turn is the layer's doing, not the user's.
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("tgnb_tinker_inside", default=False)

#: Modules whose calls are the layer's own (this package, the SDK's Tinker layer under it).
_LAYER = ("tgnb.tinker", "together.post_training")


def deprecation_of(member: Any) -> tuple[str, type[Warning]] | None:
    """The message and category a genuine tinker member is marked ``@deprecated`` with, or
    ``None``. The category is the one the decorator closed over (``DeprecationWarning``, the
    decorator's default, where it cannot be read)."""
    message = getattr(member, "__deprecated__", None)
    if not isinstance(message, str):
        return None
    code, cells = getattr(member, "__code__", None), getattr(member, "__closure__", None) or ()
    names = code.co_freevars if code is not None else ()
    closed = {name: cell.cell_contents for name, cell in zip(names, cells, strict=False)}
    category = closed.get("category")
    if not (isinstance(category, type) and issubclass(category, Warning)):
        category = DeprecationWarning
    return message, category


def _users_call() -> bool:
    """Whether the call being wrapped was made by the user's code (two frames up: past the
    wrapper), not by the layer."""
    if _INSIDE.get():
        return False
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return not any(caller == m or caller.startswith(m + ".") for m in _LAYER)


async def _flagged(
    method: Callable[..., Coroutine[Any, Any, Any]], /, *args: Any, **kwargs: Any
) -> Any:
    """``await method(*args, **kwargs)``, marked as the layer's own while it runs (the method's
    coroutine is made here, so one closed unawaited leaves none behind)."""
    token = _INSIDE.set(True)
    try:
        return await method(*args, **kwargs)
    finally:
        _INSIDE.reset(token)


def _warning(method: Callable[..., Any], message: str, category: type[Warning]) -> Any:
    """`method`, warning `message` first when the user calls it (as ``@deprecated`` does: at
    call time, at the caller's line; a coroutine function stays one)."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        def call_async(*args: Any, **kwargs: Any) -> Any:
            if _users_call():
                warnings.warn(message, category, stacklevel=2)
            return _flagged(method, *args, **kwargs)

        if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12 on
            return inspect.markcoroutinefunction(call_async)
        call_async._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
        return call_async

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _users_call():
            warnings.warn(message, category, stacklevel=2)
        token = _INSIDE.set(True)
        try:
            return method(*args, **kwargs)
        finally:
            _INSIDE.reset(token)

    return call


def warn_as_tinker_does(ours: type, theirs: type) -> list[str]:
    """Give each method of `ours` that the installed tinker's `theirs` marks deprecated tinker's
    warning; answer their names."""
    marked = []
    for name, member in vars(theirs).items():
        mark = deprecation_of(member)
        method = inspect.getattr_static(ours, name, None)
        if mark is None or not callable(method) or isinstance(method, (staticmethod, classmethod)):
            continue
        setattr(ours, name, _warning(method, *mark))
        marked.append(name)
    return sorted(marked)
