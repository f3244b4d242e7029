"""The emulator daemon's own files and options under hostile values, with real daemons (real
processes, real files, real HTTP on loopback):

- numeric options out of range (`OPTION_CASES`): ``tgnb emulator start|serve`` exits 1 with one line
  naming the flag and its range, before anything starts (no daemon, no ``server.json``, the home's
  lock free);
- a torn ``state.json`` and a broken ``state/rl/records.json``: kept aside as ``*.corrupt-<time>``
  (never overwritten), reported in the log and in health's ``state_problems``; the daemon starts
  and the clusters API serves;
- ``tgnb emulator stop --home B`` with B's ``server.json`` naming home A's pid leaves A running;
- a run's supervisor does not outlive ``tgnb emulator stop`` of its home (the training program is
  the local engine tests' stand-in, ``tests/backends/local/standin_train.py``: placement and signals only).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState
from tgnb.backends.local import supervisor_alive
from tgnb.emulator import daemon
from tgnb.emulator.testing import running_emulator
from tgnb.runs.store import RunStore

from .conftest import record
from .tables import SEED

WORKLOAD = Path(__file__).parents[1] / "backends" / "local"

#: (id, command-line options) each refused with exit 1 and one line naming the flag's range.
OPTION_CASES: list[tuple[str, list[str]]] = [
    ("time-scale-0", ["--time-scale", "0"]),
    ("time-scale-negative", ["--time-scale", "-1"]),
    ("time-scale-1e-9", ["--time-scale", "1e-9"]),
    ("time-scale-nan", ["--time-scale", "nan"]),
    ("time-scale-inf", ["--time-scale", "inf"]),
    ("port-70000", ["--port", "70000"]),
    ("port-negative", ["--port", "-1"]),
    ("chaos-5", ["--chaos", "5"]),
    ("chaos-negative", ["--chaos", "-0.5"]),
    ("capacity-negative", ["--capacity", "-1"]),
    ("drain-window-nan", ["--drain-window-s", "nan"]),
    ("provision-delay-negative", ["--provision-delay-s", "-5"]),
    ("preemption-rate-inf", ["--preemption-rate", "inf"]),
    ("chaos-delay-huge", ["--chaos-delay-s", "1e300"]),
    ("rl-price-nan", ["--rl-price-per-gpu-hour", "nan"]),
    ("rl-idle-scale-0", ["--rl-idle-scale", "0"]),
]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tgnb.emulator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _lock_free(eh: Path) -> bool:
    if not (eh / "lock").exists():
        return True
    with open(eh / "lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


@pytest.mark.parametrize("command", ["start", "serve"])
@pytest.mark.parametrize(("case", "argv"), OPTION_CASES, ids=[c for c, _ in OPTION_CASES])
def test_bad_option_refused_before_anything_starts(
    tmp_path: Path, command: str, case: str, argv: list[str]
) -> None:
    eh = daemon.emulator_home(tmp_path)
    try:
        done = _cli(command, "--home", str(tmp_path), *argv, timeout=15)
    except subprocess.TimeoutExpired:  # `serve` with an accepted value runs in the foreground
        done = None
    try:
        lines = done.stderr.strip().splitlines() if done else []
        flag = argv[0].removesuffix("-gpus")
        ok = (
            done is not None
            and done.returncode == 1
            and len(lines) == 1
            and flag in lines[0]
            and "[" in lines[0]  # the range
            and "Traceback" not in done.stderr
        )
        started = daemon.status(tmp_path).running or (eh / "server.json").exists()
        record(ok and not started and _lock_free(eh))
        assert done is not None, f"{command} {argv} was accepted and kept running"
        assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
        assert len(lines) == 1 and flag in lines[0] and "[" in lines[0], done.stderr
        assert not started, "a daemon was started"
        assert _lock_free(eh), "the home's lock is held"
    finally:
        daemon.stop(tmp_path)


def test_torn_state_json_is_kept_aside_and_reported(tmp_path: Path) -> None:
    headers_of = lambda emu: {"Authorization": f"Bearer {emu.api_key}"}  # noqa: E731
    with running_emulator(tmp_path) as emu:
        r = httpx.post(
            emu.base_url + "/v1/compute/clusters",
            json={**SEED, "cluster_name": "kept"},
            headers=headers_of(emu),
        )
        assert r.status_code == 200, r.text
    state = daemon.emulator_home(tmp_path) / "state" / "state.json"
    torn = state.read_bytes()[: len(state.read_bytes()) // 2]
    state.write_bytes(torn)
    with running_emulator(tmp_path) as emu:
        problems = emu.health().get("state_problems") or []
        kept = sorted(state.parent.glob("state.json.corrupt-*"))
        # a change is saved: the new state.json is written, the kept copy is not touched
        r = httpx.post(
            emu.base_url + "/v1/compute/clusters",
            json={**SEED, "cluster_name": "after"},
            headers=headers_of(emu),
        )
        log = (daemon.emulator_home(tmp_path) / "emulator.log").read_text()
    ok = (
        len(kept) == 1
        and kept[0].read_bytes() == torn
        and any(kept[0].name in p for p in problems)
        and kept[0].name in log
        and r.status_code == 200
    )
    record(ok)
    assert len(kept) == 1, "the torn state.json was not kept aside"
    assert kept[0].read_bytes() == torn, "the kept copy was changed"
    assert any(kept[0].name in p for p in problems), problems
    assert kept[0].name in log
    assert r.status_code == 200, r.text


def test_broken_rl_records_do_not_stop_the_daemon(tmp_path: Path) -> None:
    records = daemon.emulator_home(tmp_path) / "state" / "rl" / "records.json"
    records.parent.mkdir(parents=True)
    broken = b'{"version": 1, "resources": [{"id": "r1", "base_'
    records.write_bytes(broken)
    try:
        with running_emulator(tmp_path) as emu:
            h = emu.health()
            listed = httpx.get(
                emu.base_url + "/v1/compute/clusters",
                headers={"Authorization": f"Bearer {emu.api_key}"},
            )
    except Exception as exc:  # the daemon did not come up
        record(False)
        raise AssertionError(f"the daemon did not start: {exc}") from None
    kept = sorted(records.parent.glob("records.json.corrupt-*"))
    problems = h.get("state_problems") or []
    ok = (
        listed.status_code == 200
        and len(kept) == 1
        and kept[0].read_bytes() == broken
        and any(kept[0].name in p for p in problems)
    )
    record(ok)
    assert listed.status_code == 200, listed.text
    assert len(kept) == 1 and kept[0].read_bytes() == broken
    assert any(kept[0].name in p for p in problems), problems


def test_stop_of_another_home_leaves_this_home_running(tmp_path: Path) -> None:
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    with running_emulator(home_a) as emu:
        eb = daemon.emulator_home(home_b)
        eb.mkdir(parents=True)
        server_a = daemon.emulator_home(home_a) / "server.json"
        (eb / "server.json").write_text(server_a.read_text())  # B names A's pid
        done = _cli("stop", "--home", str(home_b))
        alive = daemon.status(home_a).running and emu.health()["pid"] == emu.pid
        record(alive and done.returncode == 0)
        assert alive, "home A's daemon was stopped by `stop --home B`"
        assert done.returncode == 0, done.stderr
        assert "not running" in done.stdout


@pytest.mark.training
def test_supervisor_does_not_outlive_emulator_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.session import attach

    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(WORKLOAD) + (os.pathsep + path if path else ""))
    monkeypatch.setenv("TGNB_EMULATOR_GONE_S", "1")
    store = RunStore(tmp_path)
    pid = None
    try:
        with running_emulator(tmp_path, time_scale=0.02):
            session = attach(local=True, home=tmp_path, cluster_type="KUBERNETES")
            run = session.launch(
                "grpo",
                name="outlive",
                preemptible=False,
                max_steps=100_000,
                env={"STANDIN_STEP_SECONDS": "0.2"},
            )
            wait_until(lambda: run.status.state == JobState.RUNNING, 90, what="the run to run")
            rec = store.get(run.id)
            pid = next(int(j.info["pid"]) for j in reversed(rec.jobs) if j.info.get("pid"))
            assert supervisor_alive(pid)
        deadline = time.monotonic() + 45  # grace 1 s + the stand-in's checkpoint on SIGTERM
        while supervisor_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        gone = not supervisor_alive(pid)
        final = store.get(run.id)
        record(gone and final.state == JobState.CANCELLED)
        assert gone, "the supervisor kept running after `tgnb emulator stop`"
        assert final.state == JobState.CANCELLED, (final.state, final.detail)
        assert "emulator" in (final.detail or ""), final.detail
    finally:
        for rec in store.list():
            for job in rec.jobs:
                for p in [job.info.get("pid"), *(job.info.get("children") or [])]:
                    if p:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(int(p), signal.SIGKILL)


def test_option_ranges_are_json_round_trip_safe() -> None:
    """server.json records every option: the accepted bounds themselves are valid options."""
    for name, (lo, hi) in daemon.OPTION_RANGES.items():
        for value in (lo, hi):
            daemon.check_options({name: value})
    assert json.loads(json.dumps(daemon.ServeOptions().flat())) == daemon.ServeOptions().flat()
