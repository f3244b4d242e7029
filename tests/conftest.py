"""Shared fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle, running_emulator


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[EmulatorHandle]:
    """A real emulator daemon on a free loopback port, time compressed 100x, stopped afterwards.

    ``emulator.base_url`` / ``emulator.api_key`` / ``emulator.env`` point the SDK or ``tg`` at it;
    ``emulator.preempt(...)``, ``.nodes(...)``, ``.requests()``, ``.set_chaos(...)``,
    ``.set_capacity(...)`` drive it. Its files live under ``tmp_path / "emulator"``.
    """
    with running_emulator(tmp_path, time_scale=0.01) as emu:
        yield emu


@pytest.fixture(scope="session")
def ip() -> Any:
    """The test IPython shell (a real `InteractiveShell`) with the tgnb extension loaded."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()  # once per process: another test module may have started it
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tgnb")
    return shell
