"""The server extension starts no emulator on a read: with none running, ``GET /tgnb/cluster``
answers 503 with the fix and nothing is started; ``POST /tgnb/attach`` (the person's action) starts
it. A real Jupyter server (pytest-jupyter) and real emulator daemons."""

from __future__ import annotations

from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tgnb.emulator import daemon
from tgnb.emulator.testing import EmulatorHandle

from .conftest import body


async def test_get_cluster_starts_no_emulator_and_attach_does(
    jp_fetch: Any, emu: EmulatorHandle
) -> None:
    daemon.stop(emu.home)
    assert not daemon.status(emu.home).running
    for path in (("tgnb", "cluster"), ("tgnb", "runs")):
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch(*path)
        assert err.value.code == 503
        message = body(err.value.response)["message"]
        assert "no local emulator runs" in message and "tgnb emulator start" in message
        assert not daemon.status(emu.home).running
    r = await jp_fetch("tgnb", "attach", method="POST", body='{"cluster": null, "local": true}')
    assert body(r)["name"] == "tgnb-demo"
    assert daemon.status(emu.home).running
    assert body(await jp_fetch("tgnb", "cluster"))["name"] == "tgnb-demo"
