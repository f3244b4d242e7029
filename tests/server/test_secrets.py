"""The API key stays on the server: with ``TOGETHER_API_KEY`` set (the emulator's key, pointed at
it through ``TOGETHER_BASE_URL``, as a user's key would point at Together), no response of any
route, error answers included, carries the key in its body or headers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tgnb.cloud import Cloud
from tgnb.emulator.testing import EmulatorHandle


@pytest.fixture
def jp_server_config(emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for name, value in emu.env.items():
        monkeypatch.setenv(name, value)
    with Cloud(api_key=emu.api_key, base_url=emu.base_url, project_id=emu.project_id) as cloud:
        cloud.create("keyed-cluster")
    return {
        "ServerApp": {"jpserver_extensions": {"tgnb.server": True}},
        "TgnbServer": {"poll_interval": 0.2},
    }


async def test_no_response_contains_the_api_key(jp_fetch: Any, emu: EmulatorHandle):
    key = emu.api_key
    answers: list[tuple[str, int, str, str]] = []

    async def call(*parts: str, **kw: Any) -> None:
        try:
            r = await jp_fetch(*parts, **kw)
        except HTTPClientError as err:
            assert err.response is not None, err
            r = err.response
        answers.append(("/".join(parts), r.code, r.body.decode(), str(r.headers)))

    await call("tgnb", "cluster")
    await call("tgnb", "scale", method="POST", body=json.dumps({"preemptible": 8}))
    await call("tgnb", "scale", method="POST", body=json.dumps({"preemptible": 12}))
    await call("tgnb", "scale", method="POST", body="{")
    await call("tgnb", "runs")
    await call("tgnb", "runs", "missing-run")
    await call("tgnb", "runs", "missing-run", "timeline")
    await call("tgnb", "attach", method="POST", body=json.dumps({"cluster": "nope"}))
    await call("tgnb", "attach", method="POST", body=json.dumps({"cluster": "keyed-cluster"}))
    await call("tgnb", "events", params={"timeout": 1.5}, request_timeout=30)
    codes = {path: code for path, code, _, _ in answers}
    assert codes["tgnb/cluster"] == 200 and codes["tgnb/runs/missing-run"] == 404
    assert any(code == 400 for _, code, _, _ in answers)
    cluster = json.loads(answers[0][2])
    assert cluster["name"] == "keyed-cluster" and cluster["backend"] == "local"
    stream = answers[-1][2]
    assert "data: " in stream and "keyed-cluster" in stream
    for path, _, text, headers in answers:
        assert key not in text, f"the API key leaked in the body of {path}"
        assert key not in headers, f"the API key leaked in the headers of {path}"
