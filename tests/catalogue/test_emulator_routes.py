"""The emulator's routes under hostile input, over real HTTP against a real daemon: every case of
`tables.TABLES` is refused with its documented status and a one-line ``{code, message, details}``
body, stores nothing, shows no secret, and health still answers. Plus the defects that need more
than one request: a broken stored record, the request log, the kube_config, a large unauthenticated
body."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import pytest
import yaml

from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .conftest import FAKE_KEY, record
from .tables import ALL, SEED, Case, Raw


@pytest.fixture(scope="module")
def target(shared_emu: EmulatorHandle) -> dict[str, str]:
    """One cluster to update and preempt, and its standard node's name."""
    r = httpx.post(
        shared_emu.base_url + "/v1/compute/clusters",
        json={**SEED, "cluster_name": "cat-target"},
        headers={"Authorization": f"Bearer {shared_emu.api_key}"},
    )
    assert r.status_code == 200, r.text
    c = r.json()
    return {"cluster": c["cluster_id"], "standard": c["gpu_worker_nodes"][0]["node_id"]}


def send(emu: EmulatorHandle, case: Case, fill: dict[str, str]) -> httpx.Response:
    path = case.path.format(**fill)
    headers: dict[str, str] = {}
    if case.auth == "key":
        headers["Authorization"] = f"Bearer {emu.api_key}"
    elif case.auth is not None:
        headers["Authorization"] = case.auth
    kw: dict[str, Any] = {}
    if isinstance(case.body, Raw):
        kw["content"] = case.body.data
        headers["Content-Type"] = "application/json"
    elif case.body is not None:
        body = json.loads(json.dumps(case.body).replace("{standard}", fill["standard"]))
        kw["json"] = body
    return httpx.request(case.method, emu.base_url + path, headers=headers, timeout=30, **kw)


def counts(emu: EmulatorHandle) -> tuple[int, int, int]:
    """(clusters, clusters listed, Post-Training resources) as the daemon reports them now."""
    h = emu.health()
    listed = sum(1 for _ in emu._call("GET", "/v1/compute/clusters")["clusters"])
    return h["clusters"], listed, h["rl_resources"]


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_case_is_refused_cleanly(
    shared_emu: EmulatorHandle, target: dict[str, str], case: Case
) -> None:
    before = counts(shared_emu)
    try:
        r = send(shared_emu, case, target)
    except httpx.TransportError as exc:  # the server may close before a huge body is sent
        pytest.fail(f"no answer: {exc!r}")
    text = r.text
    secret = FAKE_KEY in text or shared_emu.api_key in text
    server_error = r.status_code >= 500
    ok = r.status_code == case.status and len(r.content) < 20_000
    body = r.json() if ok else {}
    ok = ok and isinstance(body.get("message"), str) and "\n" not in body["message"]
    record(ok, server_error, secret)
    assert not server_error, text[:300]
    assert not secret
    assert r.status_code == case.status, text[:300]
    assert ok, text[:300]
    assert counts(shared_emu) == before  # nothing stored, the list still answers
    assert shared_emu.health()["status"] == "ok"


def test_broken_stored_records_are_skipped_not_fatal(tmp_path: Any) -> None:
    """Defect 1: state written by an older version (a dict where an int belongs, a list for a
    project) must not take the list or the projects down after a restart."""
    with running_emulator(tmp_path) as emu:
        good = emu._call("POST", "/v1/compute/clusters", json={**SEED, "cluster_name": "good"})
    state = tmp_path / "emulator" / "state" / "state.json"
    data = json.loads(state.read_text())
    proto = data["clusters"][0]
    data["clusters"] += [
        {**proto, "cluster_id": "bad-1", "duration_days": {"a": 1}},
        {**proto, "cluster_id": "bad-2", "project_id": ["p"]},
        {**proto, "cluster_id": "bad-3", "nodes": "x"},
        "not a record",
    ]
    state.write_text(json.dumps(data))
    with running_emulator(tmp_path) as emu:
        listed = emu._call("GET", "/v1/compute/clusters")["clusters"]
        assert [c["cluster_id"] for c in listed] == [good["cluster_id"]]
        assert emu._call("GET", "/v1/projects")["data"]
    log = (tmp_path / "emulator" / "emulator.log").read_text()
    assert "skipping stored cluster 'bad-1'" in log and "bad-2" in log
    record(True)


def test_request_log_survives_odd_bodies_and_masks_secrets(shared_emu: EmulatorHandle) -> None:
    """Defect 5: a NaN body (with or without the key) and form or text bodies holding secrets."""
    url = shared_emu.base_url + "/v1/compute/clusters"
    auth = {"Authorization": f"Bearer {shared_emu.api_key}"}
    httpx.post(url, content=b'{"x": NaN}')
    httpx.post(url, content=b'{"x": NaN}', headers=auth)
    httpx.post(url, content=f"api_key={FAKE_KEY}&password=hunter2".encode(), headers=auth)
    httpx.post(url, content=f'token: "{FAKE_KEY}" Authorization: Bearer abc'.encode(), headers=auth)
    r = httpx.get(shared_emu.base_url + "/_emulator/requests", headers=auth)
    assert r.status_code == 200
    text = r.text
    assert FAKE_KEY not in text and "hunter2" not in text and FAKE_KEY[:12] not in text
    assert "password=***" in text
    record(r.status_code == 200 and FAKE_KEY not in text)


def test_kube_config_is_built_by_a_yaml_library() -> None:
    """Defect 7: whatever the name, the decoded kubeconfig has one cluster, one user, one server."""
    from tgnb.emulator.models import FleetCluster, kubeconfig

    name = "a\n  cluster:\n    server: https://evil.example\nusers:\n- name: evil"
    c = FleetCluster(
        cluster_id="c",
        cluster_name=name,
        cluster_type="KUBERNETES",
        region="r",
        gpu_type="g",
        billing_type="b",
        project_id="p",
        num_gpus=8,
        desired_preemptible_gpus=0,
        cuda_version="12.8",
        nvidia_driver_version="570",
        nvidia_version_id="v",
        created_at=time.time(),
    )
    doc = yaml.safe_load(base64.b64decode(kubeconfig(c)))
    assert [x["cluster"]["server"] for x in doc["clusters"]] == ["https://127.0.0.1:6443"]
    assert len(doc["users"]) == 1 and doc["clusters"][0]["name"] == name
    record(True)


def test_unauthenticated_100mb_body_is_not_read(shared_emu: EmulatorHandle) -> None:
    """Defect 4: the key is checked before the body is read; a large authenticated body is a 413
    from its Content-Length alone."""
    sent = 0

    def chunks() -> Any:
        nonlocal sent
        for _ in range(100):
            sent += 1 << 20
            yield b" " * (1 << 20)

    url = shared_emu.base_url + "/v1/compute/clusters"
    headers = {"Content-Length": str(100 << 20)}
    try:
        r = httpx.post(url, content=chunks(), headers=headers, timeout=30)
        status = r.status_code
    except httpx.TransportError:
        status = None  # the server answered 401 and closed before all was sent
    assert status in (401, None)
    assert sent < 100 << 20 or status == 401
    r2 = httpx.post(
        url, content=b" " * (2 << 20), headers={"Authorization": f"Bearer {shared_emu.api_key}"}
    )
    assert r2.status_code == 413
    assert shared_emu.health()["status"] == "ok"
    record(r2.status_code == 413)


def test_chaos_delay_infinity_keeps_health_and_status(shared_emu: EmulatorHandle) -> None:
    """Defect 6: an infinite delay is refused, so health (and `tgnb emulator status`) answer."""
    from tgnb.emulator import daemon

    r = httpx.post(
        shared_emu.base_url + "/_emulator/chaos",
        content=b'{"fraction": 0, "delay_s": Infinity}',
        headers={"Authorization": f"Bearer {shared_emu.api_key}"},
    )
    assert r.status_code == 400
    assert daemon.status(shared_emu.home).running
    record(r.status_code == 400)
