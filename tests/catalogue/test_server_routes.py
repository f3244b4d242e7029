"""The Jupyter server extension's routes under hostile input: a real Jupyter server with the tgnb
extension, attached to a real emulator daemon. Every case is a 4xx with a one-line JSON message
and no secret; the event stream replays a bounded amount to a reconnecting client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tgnb.emulator.testing import EmulatorHandle, running_emulator
from tgnb.server.service import REPLAY

from .conftest import FAKE_KEY, record

BIG = 2**63
#: (id, method, path, body or query, expected status)
CASES: list[tuple[str, str, tuple[str, ...], Any, int]] = [
    ("attach-100k-name", "POST", ("attach",), {"cluster": "x" * 100_000}, 400),
    ("attach-nul-name", "POST", ("attach",), {"cluster": "a\x00b"}, 400),
    ("attach-int", "POST", ("attach",), {"cluster": 5}, 400),
    ("attach-list", "POST", ("attach",), {"cluster": ["x"]}, 400),
    ("attach-local-string", "POST", ("attach",), {"local": "yes"}, 400),
    ("attach-body-list", "POST", ("attach",), [], 400),
    ("attach-body-not-json", "POST", ("attach",), "not json", 400),
    ("attach-unknown", "POST", ("attach",), {"cluster": "no-such-cluster"}, 404),
    ("scale-2^63", "POST", ("scale",), {"preemptible": BIG}, 400),
    ("scale-80000", "POST", ("scale",), {"preemptible": 80_000}, 400),
    ("scale-string", "POST", ("scale",), {"preemptible": "16"}, 400),
    ("scale-12", "POST", ("scale",), {"preemptible": 12}, 400),
    ("scale-negative", "POST", ("scale",), {"preemptible": -8}, 400),
    ("scale-bool", "POST", ("scale",), {"preemptible": True}, 400),
    ("scale-float", "POST", ("scale",), {"preemptible": 8.5}, 400),
    ("scale-missing", "POST", ("scale",), {}, 400),
    ("scale-body-list", "POST", ("scale",), [16], 400),
    ("events-timeout-nan", "GET", ("events",), {"timeout": "nan"}, 400),
    ("events-timeout-inf", "GET", ("events",), {"timeout": "inf"}, 400),
    ("events-timeout-negative", "GET", ("events",), {"timeout": "-1"}, 400),
    ("events-timeout-huge", "GET", ("events",), {"timeout": "1e9"}, 400),
    ("events-timeout-text", "GET", ("events",), {"timeout": "abc"}, 400),
    ("events-since-negative", "GET", ("events",), {"since": "-1"}, 400),
    ("events-since-text", "GET", ("events",), {"since": "x"}, 400),
    ("run-unknown", "GET", ("runs", "nope"), None, 404),
    ("run-long-name", "GET", ("runs", "x" * 2000), None, 404),
    ("timeline-unknown", "GET", ("runs", "nope", "timeline"), None, 404),
]


@pytest.fixture
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    home = tmp_path_factory.mktemp("server-home")
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


async def test_server_routes_refuse_cleanly(
    jp_fetch: Any, jp_serverapp: Any, emu: EmulatorHandle
) -> None:
    await jp_fetch("tgnb", "cluster")  # attach, so the routes that need a session have one
    failures = []
    for ident, method, path, payload, status in CASES:
        kw: dict[str, Any] = {"method": method, "raise_error": False}
        if method == "POST":
            kw["body"] = payload if isinstance(payload, str) else json.dumps(payload)
        elif payload:
            kw["params"] = payload
        try:
            r = await jp_fetch("tgnb", *path, **kw)
        except HTTPClientError as exc:
            r = exc.response
        text = r.body.decode(errors="replace") if r is not None and r.body else ""
        code = r.code if r is not None else 599
        leaked = FAKE_KEY[:12] in text or emu.api_key in text
        try:
            message = json.loads(text).get("message", "")
        except ValueError:
            message = None
        ok = code == status and isinstance(message, str) and "\n" not in message
        ok = ok and len(text) < 5000
        record(ok, server_error=code >= 500, secret=leaked)
        if not ok or leaked:
            failures.append((ident, code, text[:200]))
    assert not failures, failures


async def test_event_replay_is_bounded(jp_fetch: Any, jp_serverapp: Any) -> None:
    """Defect 9: after 2,000 large snapshots a reconnecting client gets the latest snapshot and
    the recent events, at most `REPLAY` messages, not the whole buffer."""
    await jp_fetch("tgnb", "cluster")
    cockpit = jp_serverapp.web_app.settings["tgnb_cockpit"]
    for i in range(2000):
        cockpit._publish({"type": "cluster", "cluster": {"i": i, "pad": "x" * 2000}})
    for i in range(300):
        cockpit._publish({"type": "event", "event": {"i": i}, "live": True})
    for params in ({"timeout": "0.5"}, {"timeout": "0.5", "since": "1"}):
        seq = cockpit.seq
        r = await jp_fetch("tgnb", "events", params=params, request_timeout=30)
        text = r.body.decode()
        ids = [int(x[4:]) for x in text.splitlines() if x.startswith("id: ") and int(x[4:]) <= seq]
        assert 0 < len(ids) <= REPLAY and len(text) < 300_000
        assert text.count('"pad"') <= 1  # one cluster snapshot at most, the latest
        record(len(ids) <= REPLAY)
    r = await jp_fetch("tgnb", "events", params={"timeout": "0.5", "since": str(cockpit.seq - 3)})
    ids = [int(line[4:]) for line in r.body.decode().splitlines() if line.startswith("id: ")]
    assert ids[:3] == [cockpit.seq - 2, cockpit.seq - 1, cockpit.seq]
    record(True)
