"""The test harness itself: a real daemon, real HTTP, the admin helpers."""

from __future__ import annotations

import httpx

from tgnb.emulator.testing import EmulatorHandle


def test_fixture_serves_the_api_with_its_key(emulator: EmulatorHandle) -> None:
    r = httpx.get(
        emulator.base_url + "/v1/compute/clusters",
        headers={"Authorization": f"Bearer {emulator.api_key}"},
    )
    assert r.status_code == 200
    assert r.json() == {"clusters": []}
    assert emulator.env["TOGETHER_BASE_URL"] == emulator.base_url
    assert emulator.health()["time_scale"] == 0.01
    log = emulator.requests()
    assert [(e["method"], e["path"], e["status"]) for e in log] == [
        ("GET", "/v1/compute/clusters", 200)
    ]
    assert emulator.clear_requests() == 1
    assert emulator.requests() == []


def test_handle_client_and_env_point_at_the_emulator(emulator: EmulatorHandle) -> None:
    client = emulator.client(max_retries=0)
    assert str(client.base_url).rstrip("/") == emulator.base_url
    assert client.clusters.list().clusters == []
    env = emulator.env
    assert env["TOGETHER_API_KEY"] == emulator.api_key
    assert env["TOGETHER_PROJECT_ID"] == emulator.project_id
    assert env["TGNB_HOME"] == str(emulator.home)
