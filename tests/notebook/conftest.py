"""Fixtures for the notebook surface: a real IPython shell with ``%load_ext tgnb``, attached to a
real emulator daemon over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle


@pytest.fixture
def tg(ip: Any) -> Iterator[Any]:
    """The `Tg` magics instance, detached before and after each test."""
    magics = ip.magics_manager.registry["Tg"]
    magics.session = None
    yield magics
    magics.session = None


@pytest.fixture
def attached(
    ip: Any, tg: Any, emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> EmulatorHandle:
    """``%tg attach --local`` against the `emulator` fixture; its request log cleared after."""
    for key, value in emulator.env.items():
        monkeypatch.setenv(key, value)
    ip.run_line_magic("tg", "attach --local")
    assert tg.session is not None
    emulator.clear_requests()
    return emulator
