"""A sweep in the sidebar's API (issue 47 §2): ``GET /tgnb/sweeps``, ``GET /tgnb/sweeps/<name>``
(its table), ``GET /tgnb/sweeps/<name>/chart`` (SVG) and ``POST /tgnb/sweeps/<name>/stop`` on
a real Jupyter server attached to a real emulator, over runs of ``session.map`` (real processes
on the local engine)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle

from .conftest import body


def halve(x: int) -> float:
    return x / 2


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_sweep_routes_give_its_table_chart_and_one_stop(
    jp_fetch: Any, emu: EmulatorHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.session import attach

    wd = tmp_path / "wd"
    wd.mkdir()
    monkeypatch.chdir(wd)
    session = attach(local=True, home=emu.home)
    assert await asyncio.to_thread(session.scale, preemptible=8, wait=True, timeout=60, poll=0.2)
    halves = session.executor(name="halves", gpus_per_node=1).map(halve, [3, 5])
    await asyncio.to_thread(halves.wait, timeout=300, poll=0.5)
    await jp_fetch("tgnb", "cluster")  # the server's own session, on the same cluster

    listed = body(await jp_fetch("tgnb", "sweeps"))["sweeps"]
    assert [s["name"] for s in listed] == ["halves"]
    one = listed[0]
    assert one["runs"] == ["halves-0", "halves-1"] and one["states"] == {"succeeded": 2}
    assert one["finished"] is True and one["source"] == "map"
    assert (one["best"], one["best_metric"], one["best_value"]) == ("halves-1", "result", 2.5)
    assert "rows" not in one  # the list is short: the table comes with one sweep

    detail = body(await jp_fetch("tgnb", "sweeps", "halves"))
    assert [(r["run"], r["state"], r["best"]) for r in detail["rows"]] == [
        ("halves-0", "succeeded", 1.5),
        ("halves-1", "succeeded", 2.5),
    ]
    chart = await jp_fetch("tgnb", "sweeps", "halves", "chart")
    assert chart.headers["Content-Type"].startswith("image/svg+xml")
    svg = chart.body.decode()
    assert svg.startswith("<svg") and "halves-1 · succeeded" in svg

    stop = await jp_fetch("tgnb", "sweeps", "halves", "stop", method="POST", body="{}")
    assert body(stop) == {"stopped": []}  # every run had finished

    sleepers = session.executor(name="sleepers", gpus_per_node=1).map(time.sleep, [600, 600])
    await asyncio.to_thread(wait_until, lambda: all(r.status.nodes for r in sleepers), timeout=120)
    stop = await jp_fetch("tgnb", "sweeps", "sleepers", "stop", method="POST", body="{}")
    assert body(stop) == {"stopped": ["sleepers-0", "sleepers-1"]}
    rows = await asyncio.to_thread(sleepers.wait, timeout=120, poll=0.5)
    assert [r.state for r in rows] == ["cancelled", "cancelled"]

    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("tgnb", "sweeps", "nope")
    assert info.value.code == 404
    message = json.loads(info.value.response.body)["message"]
    assert message.startswith("no sweep named 'nope'") and "session.sweeps()" in message
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("tgnb", "sweeps", "nope", "stop", method="POST", body="{}")
    assert info.value.code == 404
