"""Fixtures of the server-extension tests: pytest-jupyter's server fixtures (``jp_fetch``,
``jp_serverapp``), a real emulator daemon on loopback, and the tgnb server extension enabled on a
test Jupyter server whose one `Session` attaches to that emulator."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.local import supervisor_alive
from tgnb.emulator.testing import EmulatorHandle, running_emulator
from tgnb.runs.store import RunStore

try:  # pytest-jupyter's jp_* fixtures and the hooks that run async tests, for this folder only
    from pytest_jupyter.jupyter_server import *  # noqa: F403
except ImportError:
    if os.environ.get("CI", "").lower() == "true":
        raise
    collect_ignore_glob = ["test_*.py"]  # pip install 'pytest-jupyter[server]' to run them

#: The workload tests' stand-in trainer (counts steps, checkpoints on a drain notice, exits 75).
STANDIN_DIR = Path(__file__).resolve().parents[1] / "backends" / "local"


@pytest.fixture
def tgnb_home(tmp_path: Path) -> Path:
    home = tmp_path / "tgnb-home"
    home.mkdir()
    return home


@pytest.fixture
def emu(tgnb_home: Path) -> Iterator[EmulatorHandle]:
    """A real emulator daemon for the tgnb home (time compressed 100x: a 3 s drain window)."""
    with running_emulator(tgnb_home, time_scale=0.01) as handle:
        try:
            yield handle
        finally:
            stop_runs(tgnb_home)


def stop_runs(home: Path, timeout: float = 60.0) -> None:
    """Cancel the unfinished runs a test launched, wait for their supervisors, kill leftovers."""
    if not (home / "runs.sqlite").exists():
        return
    store = RunStore(home)
    pids = [int(j.info["pid"]) for r in store.list() for j in r.jobs if j.info.get("pid")]
    for rec in store.list():
        if not rec.state.finished:
            for job in rec.jobs:
                if job.info.get("pid") and supervisor_alive(int(job.info["pid"])):
                    os.kill(int(job.info["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(supervisor_alive(p) for p in pids):
        time.sleep(0.2)
    for rec in store.list():
        for job in rec.jobs:
            for pid in [job.info.get("pid"), *(job.info.get("children") or [])]:
                if pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(int(pid), signal.SIGKILL)


@pytest.fixture
def local_env(emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> EmulatorHandle:
    """No TOGETHER_API_KEY: the server attaches to the local emulator under TGNB_HOME."""
    for name in ("TOGETHER_API_KEY", "TOGETHER_BASE_URL", "TOGETHER_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TGNB_HOME", str(emu.home))
    return emu


@pytest.fixture
def jp_server_config(local_env: EmulatorHandle) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"tgnb.server": True}},
        "TgnbServer": {"poll_interval": 0.2},
    }


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs launched by the test run the stand-in trainer, not TRL."""
    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))


def body(response: Any) -> Any:
    return json.loads(response.body.decode())


def sse_messages(text: str) -> list[tuple[int, dict[str, Any]]]:
    """The ``(id, message)`` pairs of a server-sent event stream's text."""
    out = []
    for block in text.split("\n\n"):
        ident, data = None, ""
        for line in block.splitlines():
            if line.startswith("id: "):
                ident = int(line[4:])
            elif line.startswith("data: "):
                data += line[6:]
        if ident is not None and data:
            out.append((ident, json.loads(data)))
    return out
