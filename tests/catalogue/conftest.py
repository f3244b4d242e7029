"""The fault catalogue's ground: one real emulator daemon shared by the folder, the tally of
outcomes, and the line printed at the end of the session::

    fault catalogue: N cases, N refused cleanly, 0 server errors, 0 secrets seen

A case is refused cleanly when the answer is the documented refusal (a 4xx with a one-line
message naming the field, a typed `tgnb.errors` exception, an IPython `UsageError`) and nothing
was stored. Every case also asserts it, so a misbehaving case fails its test.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.config import register_secret
from tgnb.emulator.testing import EmulatorHandle, running_emulator

try:  # pytest-jupyter's jp_* fixtures for the server-extension cases, for this folder only
    from pytest_jupyter.jupyter_server import *  # noqa: F403
except ImportError:
    if os.environ.get("CI", "").lower() == "true":
        raise
    collect_ignore = ["test_server_routes.py"]

#: A key-shaped value the cases plant in bodies, configs and env; it must never come back.
FAKE_KEY = "tgp_FAKE_SECRET_1234567890abcdefghijklmnopqrstuvwxyz"
register_secret(FAKE_KEY)

TALLY: Counter[str] = Counter()


def record(refused: bool, server_error: bool = False, secret: bool = False) -> None:
    """Count one case (the test asserts the same facts)."""
    TALLY["cases"] += 1
    TALLY["refused"] += int(refused and not server_error and not secret)
    TALLY["server_errors"] += int(server_error)
    TALLY["secrets"] += int(secret)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY["cases"]:
        terminalreporter.write_line(
            f"fault catalogue: {TALLY['cases']} cases, {TALLY['refused']} refused cleanly, "
            f"{TALLY['server_errors']} server errors, {TALLY['secrets']} secrets seen"
        )


@pytest.fixture(scope="session")
def shared_emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    """One emulator daemon for the catalogue's HTTP cases, with one cluster to update."""
    home: Path = tmp_path_factory.mktemp("catalogue")
    with running_emulator(home, time_scale=0.01) as emu:
        yield emu
