"""The server extension follows the platform: when the emulator it is attached to stops, the event
stream says ``detached`` and the next read answers 503 with the fix (starting nothing); when an
emulator runs again, on another port, the next read attaches to it. A real Jupyter server
(pytest-jupyter) and real emulator daemons over loopback HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import async_wait_until
from tgnb.emulator import daemon
from tgnb.emulator.testing import EmulatorHandle, free_port

from .conftest import body
from .test_handlers import stream


async def test_a_stopped_then_moved_emulator_is_followed(
    jp_fetch: Any, emu: EmulatorHandle, jp_serverapp: Any
) -> None:
    first = body(await jp_fetch("tgnb", "cluster"))
    assert first["name"] == "tgnb-demo" and first["local"] is True
    last = (await stream(jp_fetch, timeout=0.5))[-1][0]

    daemon.stop(emu.home)
    seen: list[dict[str, Any]] = []

    async def detached() -> bool:
        nonlocal last
        got = await stream(jp_fetch, since=last, timeout=0.5)
        if got:
            last = got[-1][0]
        seen.extend(m for _, m in got)
        return any(m["type"] == "detached" for m in seen)

    await async_wait_until(detached, 60, what="the detached message")
    gone = next(m for m in seen if m["type"] == "detached")
    assert gone["message"] and "Traceback" not in gone["message"]
    assert body(await jp_fetch("tgnb", "status"))["attached"] is False
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("tgnb", "cluster")
    assert err.value.code == 503
    assert "tgnb emulator start" in body(err.value.response)["message"]
    assert not daemon.status(emu.home).running  # a read started nothing

    port = free_port()
    options = daemon.ServeOptions.of(time_scale=0.01, port=port)
    st, started = daemon.start(emu.home, options, emu.api_key)
    assert started and st.base_url and st.base_url.endswith(f":{port}")
    assert st.base_url != emu.base_url
    again = body(await jp_fetch("tgnb", "cluster"))
    assert again["name"] == "tgnb-demo"
    session = jp_serverapp.web_app.settings["tgnb_cockpit"].attached
    assert session is not None and session.emulator.base_url == st.base_url
    seen.clear()
    await async_wait_until(lambda: _snapshot_after(jp_fetch, last, seen), 60, what="a snapshot")


async def _snapshot_after(jp_fetch: Any, since: int, seen: list[dict[str, Any]]) -> bool:
    """Whether the stream after message `since` holds a cluster snapshot (collected in `seen`)."""
    seen[:] = [m for _, m in await stream(jp_fetch, since=since, timeout=0.5)]
    return any(m["type"] == "cluster" for m in seen)
