"""`Mapped`: submitted operations' futures seen as one, with a function of their results."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

U = TypeVar("U")


class Mapped(Generic[U]):
    """``fn(*results)`` of `futures` (Tinker's ``APIFuture`` surface: ``result()``,
    ``result_async()``, ``await``). The futures were submitted already: this only waits."""

    def __init__(self, fn: Callable[..., U], *futures: Any) -> None:
        self._fn, self._futures = fn, futures

    def result(self, timeout: float | None = None) -> U:
        return self._fn(*(f.result(timeout=timeout) for f in self._futures))

    async def result_async(self, timeout: float | None = None) -> U:
        done = await asyncio.gather(*(f.result_async(timeout=timeout) for f in self._futures))
        return self._fn(*done)

    def __await__(self) -> Generator[Any, None, U]:
        return self.result_async().__await__()
