"""The server extension's and the emulator's routes under the second red-team pass (issue 24,
items 20 and 25): a real Jupyter server with the tgnb extension attached to a real emulator daemon.

- Bodies nested 100k and 30k deep, a flat object nested 20 deep: 400; bodies over the 1 MiB cap
  (2 MB of nesting, 60 MB of padding): 413 before any parsing. Never a 500, each fast.
- Unknown fields in ``/tgnb/scale`` and ``/tgnb/attach`` bodies: 400 naming the field, nothing
  scaled.
- A 404 shows no local path (the run store's ``runs.sqlite`` was named by its absolute path).
- A training session's ``display_name`` of 100k characters, or with a NUL or a bidi control:
  400 from the emulator's Post-Training routes (create and update).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tornado.httpclient import HTTPClientError

from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .conftest import FAKE_KEY, record

_DEEP_100K = "[" * 100_000 + "]" * 100_000
_DEEP_30K = "[" * 30_000 + "]" * 30_000
_DEEP_2M = "[" * (1 << 20) + "]" * (1 << 20)
_DEEP_OBJ = '{"preemptible": ' + '{"a": ' * 20 + "1" + "}" * 20 + "}"
_HUGE = json.dumps({"preemptible": 16, "pad": "x" * (60 << 20)})

#: (id, method, path, body (a str is sent as it is), expected status, a word the message holds)
CASES: list[tuple[str, str, tuple[str, ...], Any, int, str]] = [
    ("scale-deep-100k", "POST", ("scale",), _DEEP_100K, 400, "deeper"),
    ("attach-deep-100k", "POST", ("attach",), _DEEP_100K, 400, "deeper"),
    ("scale-deep-30k", "POST", ("scale",), _DEEP_30K, 400, "deeper"),
    ("attach-deep-30k", "POST", ("attach",), _DEEP_30K, 400, "deeper"),
    ("scale-deep-object", "POST", ("scale",), _DEEP_OBJ, 400, "deeper"),
    ("attach-deep-object", "POST", ("attach",), '{"cluster":' + _DEEP_OBJ + "}", 400, "deeper"),
    ("scale-deep-2MB", "POST", ("scale",), _DEEP_2M, 413, "bytes"),
    ("scale-60MB", "POST", ("scale",), _HUGE, 413, "bytes"),
    ("attach-60MB", "POST", ("attach",), _HUGE, 413, "bytes"),
    ("scale-unknown-field", "POST", ("scale",), {"preemptible": 16, "evil": 1}, 400, "evil"),
    ("scale-typo-field", "POST", ("scale",), {"preemtible": 16}, 400, "preemtible"),
    ("attach-unknown-field", "POST", ("attach",), {"cluster": None, "force": True}, 400, "force"),
    ("run-unknown-no-path", "GET", ("runs", "nope"), None, 404, "nope"),
    ("timeline-unknown-no-path", "GET", ("runs", "nope", "timeline"), None, 404, "nope"),
]


@pytest.fixture
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    home = tmp_path_factory.mktemp("server2-home")
    with running_emulator(home, time_scale=0.01) as handle:
        yield handle


@pytest.fixture
def jp_server_config(emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for name in ("TOGETHER_API_KEY", "TOGETHER_BASE_URL", "TOGETHER_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TGNB_HOME", str(emu.home))
    return {
        "ServerApp": {"jpserver_extensions": {"tgnb.server": True}},
        "TgnbServer": {"poll_interval": 0.2},
    }


async def test_server_bodies_and_fields_refused(
    jp_fetch: Any, jp_serverapp: Any, emu: EmulatorHandle
) -> None:
    first = await jp_fetch("tgnb", "cluster")  # attach, so the routes that need a session have one
    target = json.loads(first.body)["desired_preemptible_gpus"]
    failures = []
    for ident, method, path, payload, status, word in CASES:
        kw: dict[str, Any] = {"method": method, "raise_error": False, "request_timeout": 120}
        if method == "POST":
            kw["body"] = payload if isinstance(payload, str) else json.dumps(payload)
        started = time.monotonic()
        try:
            r = await jp_fetch("tgnb", *path, **kw)
        except HTTPClientError as exc:
            r = exc.response
        took = time.monotonic() - started
        text = r.body.decode(errors="replace") if r is not None and r.body else ""
        code = r.code if r is not None else 599
        leaked = FAKE_KEY[:12] in text or emu.api_key in text
        try:
            message = json.loads(text).get("message", "")
        except ValueError:
            message = None
        ok = code == status and isinstance(message, str) and "\n" not in message
        ok = ok and word in (message or "") and len(text) < 5000  # a hang: request_timeout
        ok = ok and str(emu.home) not in text and "runs.sqlite" not in text
        record(ok, server_error=code >= 500, secret=leaked)
        if not ok or leaked:
            failures.append((ident, code, round(took, 1), text[:200]))
    assert not failures, failures
    now = await jp_fetch("tgnb", "cluster")
    assert json.loads(now.body)["desired_preemptible_gpus"] == target  # nothing was scaled


#: (id, body of a training-session create) for the emulator's Post-Training route
NAMES: list[tuple[str, Any]] = [
    ("100k", "n" * 100_000),
    ("nul", "a\x00b"),
    ("newline", "a\nb"),
    ("bidi", "lr\u202e4-e1"),
    ("257", "n" * 257),
]


@pytest.mark.parametrize("where", ["create", "update"])
@pytest.mark.parametrize("name", NAMES, ids=[n[0] for n in NAMES])
def test_display_name_bounded(
    shared_emu: EmulatorHandle, name: tuple[str, Any], where: str
) -> None:
    """Shape checks come before references: a bad name is a 400 whatever the resource or
    session id (today's code answered 404 for the unknown id, the name having passed)."""
    headers = {"Authorization": f"Bearer {shared_emu.api_key}"}
    url = shared_emu.base_url + "/v1/rl/training-sessions"
    if where == "create":
        body = {"model_resources_id": "mr-nope", "display_name": name[1]}
        r = httpx.post(url, json=body, headers=headers, timeout=30)
    else:
        r = httpx.patch(url + "/ts-nope", json={"display_name": name[1]}, headers=headers)
    message = (
        r.json().get("message", "")
        if r.headers.get("content-type", "").startswith("application/json")
        else ""
    )
    ok = r.status_code == 400 and "display_name" in message and len(r.text) < 5000
    record(ok, server_error=r.status_code >= 500)
    assert ok, (r.status_code, r.text[:200])
