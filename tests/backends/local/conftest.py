"""Fixtures of the local engine's tests: a real emulator daemon (real HTTP on loopback), a
`tgnb.Session` attached to a cluster on it, and clean-up that stops every supervisor and training
process a test started before the emulator goes."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tgnb.backends.local import supervisor_alive
from tgnb.emulator.testing import EmulatorHandle, running_emulator
from tgnb.runs.store import RunStore
from tgnb.session import Session, attach

HERE = Path(__file__).parent


def stop_everything(store: RunStore, timeout: float = 60.0) -> None:
    """Cancel unfinished runs, wait for their supervisors, then kill whatever is left."""
    records = store.list()
    pids = {r.id: [j.info.get("pid") for j in r.jobs if j.info.get("pid")] for r in records}
    for rec in records:
        if not rec.state.finished:
            for pid in pids[rec.id]:
                if supervisor_alive(pid):
                    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        supervisor_alive(p) for ps in pids.values() for p in ps
    ):
        time.sleep(0.2)
    for rec in store.list():
        for job in rec.jobs:
            for pid in [job.info.get("pid"), *(job.info.get("children") or [])]:
                if pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(int(pid), signal.SIGKILL)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the stand-in training program instead of ``python -m tgnb.train`` (supervisor tests)."""
    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(HERE) + (os.pathsep + path if path else ""))


@pytest.fixture
def emu(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EmulatorHandle]:
    """A real emulator daemon for tgnb home `tmp_path`; time compressed (window 6 s by default;
    a test may ask for another scale with ``@pytest.mark.parametrize('time_scale', ...)``)."""
    scale = getattr(request, "param", None) or 0.02
    with running_emulator(tmp_path, time_scale=scale) as handle:
        try:
            yield handle
        finally:
            stop_everything(RunStore(tmp_path))


def make_session(home: Path, cluster_type: str = "KUBERNETES", target: int = 16) -> Session:
    """Attach to a new demo cluster on the running emulator, raise the target, wait for it."""
    session = attach(local=True, home=home, cluster_type=cluster_type)
    if target:
        done = session.scale(preemptible=target, wait=True, timeout=60, poll=0.2)
        assert done, done
    return session


@pytest.fixture
def session(emu: EmulatorHandle, tmp_path: Path) -> Session:
    """A KUBERNETES-type demo cluster with the preemptible target at 16 (two nodes up)."""
    return make_session(tmp_path)
