"""The daemon: start/stop/status through the real ``tgnb emulator`` command, restart persistence."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import together

from tests.conftest import wait_until
from tgnb.config import Secret
from tgnb.emulator import daemon
from tgnb.emulator.testing import running_emulator
from tgnb.errors import EmulatorError

from .conftest import create


def tgnb(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "emulator", *args],
        env={**os.environ, "TGNB_HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_start_twice_finds_the_running_one_and_stop_stops_it(tmp_path: Path) -> None:
    try:
        first = tgnb(tmp_path, "start", "--time-scale", "0.01")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("started")
        # the starting process has exited; the daemon lives on in its own session
        st = daemon.status(tmp_path)
        assert st.running and st.pid and st.base_url
        assert os.getsid(st.pid) != os.getsid(0)
        second = tgnb(tmp_path, "start")
        assert second.returncode == 0 and second.stdout.startswith("already running")
        assert f"pid {st.pid}" in second.stdout
        info = json.loads(tgnb(tmp_path, "status", "--json").stdout)
        assert info["running"] and info["pid"] == st.pid and info["base_url"] == st.base_url
        key_file = tmp_path / "emulator" / "api_key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert isinstance(st.api_key, Secret) and "***" in repr(st.api_key)
        assert st.api_key.get() == key_file.read_text().strip()
        assert st.api_key.get() not in first.stdout + second.stdout
        # a second server on the same home is refused by the home lock
        with pytest.raises(EmulatorError, match="already runs"):
            daemon.serve(tmp_path)
    finally:
        stopped = tgnb(tmp_path, "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not daemon.status(tmp_path).running
    assert tgnb(tmp_path, "status").returncode == 1
    assert "was not running" in tgnb(tmp_path, "stop").stdout


def test_key_from_the_environment_is_used_and_saved(tmp_path: Path) -> None:
    try:
        r = tgnb(tmp_path, "start", env={daemon.KEY_ENV: "tgnb-env-key-42"})
        assert r.returncode == 0, r.stderr
        st = daemon.status(tmp_path)
        assert st.api_key is not None and st.api_key.get() == "tgnb-env-key-42"
        client = together.Together(base_url=st.base_url, api_key="tgnb-env-key-42", max_retries=0)
        assert client.clusters.list().clusters == []
    finally:
        daemon.stop(tmp_path)


def test_the_users_real_key_stays_out_of_the_daemon(tmp_path: Path) -> None:
    real = "tgnb-real-user-key-must-not-reach-the-daemon"
    try:
        r = tgnb(tmp_path, "start", env={"TOGETHER_API_KEY": real})
        assert r.returncode == 0, r.stderr
        st = daemon.status(tmp_path)
        assert st.pid is not None
        environ = Path(f"/proc/{st.pid}/environ").read_bytes()
        assert real.encode() not in environ
        assert st.api_key is not None and st.api_key.get() != real
    finally:
        daemon.stop(tmp_path)


def test_state_survives_a_restart_with_a_pending_drain_window(tmp_path: Path) -> None:
    """Clusters, nodes, events and a drain deadline set before a restart are honoured after it."""
    with running_emulator(tmp_path, time_scale=0.01, drain_window_s=600) as emu:
        sdk = together.Together(base_url=emu.base_url, api_key=emu.api_key, max_retries=0)
        cid = create(sdk, num_preemptible_gpus=8, project_id="p").cluster_id
        wait_until(lambda: sdk.clusters.retrieve(cid).allocated_preemptible_gpus == 8)
        victim = emu.preempt(cid)
        first_pid = emu.pid
    assert not daemon.status(tmp_path).running

    with running_emulator(tmp_path, time_scale=0.01, drain_window_s=600) as emu:
        assert emu.pid != first_pid
        sdk = together.Together(base_url=emu.base_url, api_key=emu.api_key, max_retries=0)
        got = sdk.clusters.retrieve(cid)
        assert got.desired_preemptible_gpus == 8
        reasons = [(e.reason, e.node_id) for e in got.node_lifecycle_events or []]
        assert ("TogetherPreemptionNotified", victim["name"]) in reasons
        node = next(n for n in emu.nodes(cid) if n["name"] == victim["name"])
        assert node["deadline"] == victim["deadline"]  # the same deadline, not a new window
        wait_until(
            lambda: any(
                e.reason == "TogetherPreempted"
                for e in sdk.clusters.retrieve(cid).node_lifecycle_events or []
            ),
            timeout=60,
        )
        wait_until(lambda: sdk.clusters.retrieve(cid).allocated_preemptible_gpus == 8)


def test_serve_runs_in_the_foreground_until_sigterm(tmp_path: Path) -> None:
    from tgnb.emulator.testing import free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tgnb.emulator", "serve", "--home", str(tmp_path)),
            *("--port", str(port), "--capacity", "8", "--time-scale", "0.5", "--chaos", "0.25"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: proc.poll() is not None or daemon.status(tmp_path).running, 60)
        assert proc.poll() is None, "the daemon exited"
        st = daemon.status(tmp_path)
        assert st.pid == proc.pid and st.base_url == f"http://127.0.0.1:{port}"
        assert st.api_key is not None
        health = httpx.get(
            f"{st.base_url}/_emulator/health",
            headers={"Authorization": f"Bearer {st.api_key.get()}"},
        ).json()
        assert (health["capacity_gpus"], health["time_scale"]) == (8, 0.5)
        assert health["chaos"]["fraction"] == 0.25
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"serving http://127.0.0.1:{port}" in out
    assert not (tmp_path / "emulator" / "server.json").exists()
