"""The seeded chaos knob: 429, 503 and delays past the client's timeout, reproducibly."""

from __future__ import annotations

import httpx
import pytest
import together

from tgnb.emulator.testing import EmulatorHandle

from .conftest import create


def _statuses(emulator: EmulatorHandle, n: int) -> list[int]:
    headers = {"Authorization": f"Bearer {emulator.api_key}"}
    with httpx.Client(base_url=emulator.base_url, headers=headers) as http:
        return [http.get("/v1/compute/clusters").status_code for _ in range(n)]


def test_chaos_is_seeded_and_deterministic(emulator: EmulatorHandle) -> None:
    emulator.set_chaos(0.5, seed=7, kinds=("429", "503"))
    first = _statuses(emulator, 30)
    emulator.set_chaos(0.5, seed=7, kinds=("429", "503"))
    again = _statuses(emulator, 30)
    emulator.set_chaos(0.5, seed=8, kinds=("429", "503"))
    other = _statuses(emulator, 30)
    assert first == again
    assert first != other
    assert {200, 429, 503} == set(first)
    assert 5 < first.count(200) < 25
    log = emulator.requests()
    assert [e["status"] for e in log[:30]] == first
    assert all((e["chaos"] is None) == (e["status"] == 200) for e in log)


def test_sdk_retries_through_chaos(emulator: EmulatorHandle) -> None:
    client = together.Together(base_url=emulator.base_url, api_key=emulator.api_key, max_retries=6)
    emulator.set_chaos(0.3, seed=1, kinds=("429", "503"), retry_after_ms=10)
    cid = create(client, num_preemptible_gpus=8, project_id="p").cluster_id
    for _ in range(10):
        assert client.clusters.retrieve(cid).cluster_id == cid
    log = emulator.requests()
    assert any(e["status"] in (429, 503) for e in log)
    assert sum(e["method"] == "POST" and e["status"] == 200 for e in log) == 1


def test_delay_past_the_client_timeout(emulator: EmulatorHandle) -> None:
    emulator.set_chaos(1.0, seed=0, kinds=("delay",), delay_s=3.0)
    client = together.Together(
        base_url=emulator.base_url, api_key=emulator.api_key, max_retries=0, timeout=0.5
    )
    with pytest.raises(together.APITimeoutError):
        client.clusters.list()


def test_chaos_never_touches_admin_or_v3(emulator: EmulatorHandle) -> None:
    emulator.set_chaos(1.0, seed=0, kinds=("503",))
    assert emulator.health()["chaos"]["fraction"] == 1.0
    client = together.Together(base_url=emulator.base_url, api_key=emulator.api_key, max_retries=0)
    assert client.whoami().type == "project_api_key"
    with pytest.raises(together.InternalServerError):
        client.clusters.list()
    assert emulator.clear_requests() == 2


def test_bad_chaos_settings_are_refused(emulator: EmulatorHandle) -> None:
    with pytest.raises(httpx.HTTPStatusError):
        emulator.set_chaos(1.5)
    with pytest.raises(httpx.HTTPStatusError):
        emulator.set_chaos(0.1, kinds=("418",))
