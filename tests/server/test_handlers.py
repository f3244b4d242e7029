"""The server extension's API on a real Jupyter server (pytest-jupyter) whose `Session` attaches to
a real emulator daemon over loopback HTTP: cluster state, scale (and its refusals), runs, the event
stream. Nothing is faked; runs use the local engine tests' stand-in trainer instead of TRL."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import together
from tornado.httpclient import HTTPClientError

from tests.conftest import async_wait_until, wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import PREEMPTION_NOTIFIED, RUN_RESUMED
from tgnb.events import TARGET_CHANGED as TARGET

from .conftest import body, sse_messages


def emulator_target(emu: EmulatorHandle, cluster_id: str) -> int:
    """The preemptible target as the emulator holds it, read with the official SDK."""
    client = together.Together(base_url=emu.base_url, api_key=emu.api_key)
    try:
        return int(client.clusters.retrieve(cluster_id).desired_preemptible_gpus or 0)
    finally:
        client.close()


async def stream(jp_fetch: Any, since: int = 0, timeout: float = 2.0) -> list[tuple[int, Any]]:
    r = await jp_fetch(
        "tgnb", "events", params={"since": since, "timeout": timeout}, request_timeout=timeout + 30
    )
    assert r.headers["Content-Type"].startswith("text/event-stream")
    return sse_messages(r.body.decode())


async def test_cluster_attaches_lazily_to_the_local_emulator(jp_fetch: Any, emu: EmulatorHandle):
    r = await jp_fetch("tgnb", "cluster")
    c = body(r)
    assert c["name"] == "tgnb-demo"
    assert c["backend"] == "local" and c["local"] is True
    assert c["desired_preemptible_gpus"] == 0 == c["allocated_preemptible_gpus"]
    names = [x["cluster_name"] for x in emu._call("GET", "/v1/compute/clusters")["clusters"]]
    assert names == ["tgnb-demo"]


async def test_scale_sets_the_emulator_target_and_capacity_follows(
    jp_fetch: Any, emu: EmulatorHandle
):
    c = body(await jp_fetch("tgnb", "scale", method="POST", body=json.dumps({"preemptible": 16})))
    assert c["desired_preemptible_gpus"] == 16
    assert emulator_target(emu, c["id"]) == 16

    async def allocated() -> bool:
        state = body(await jp_fetch("tgnb", "cluster"))
        return state["allocated_preemptible_gpus"] == 16 and state["capacity_reached"]

    await async_wait_until(allocated, what="16 preemptible GPUs allocated")
    state = body(await jp_fetch("tgnb", "cluster"))
    assert [n["kind"] for n in state["nodes"]].count("preemptible") == 2


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"preemptible": 12}, "multiple of 8"),
        ({"preemptible": -8}, ">= 0"),
        ({"preemptible": "16"}, "not the string"),
        ({"preemptible": True}, "integer"),
        ({}, '{"preemptible": N}'),
        ([16], "JSON object"),
        ("not json", "JSON object"),
    ],
)
async def test_scale_refuses_bad_targets_with_400_and_sends_nothing(
    jp_fetch: Any, emu: EmulatorHandle, payload: Any, needle: str
):
    cluster_id = body(await jp_fetch("tgnb", "cluster"))["id"]
    emu.clear_requests()
    raw = payload if isinstance(payload, str) else json.dumps(payload)
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("tgnb", "scale", method="POST", body=raw)
    assert err.value.code == 400
    assert err.value.response is not None
    message = body(err.value.response)["message"]
    assert needle in message and "\n" not in message
    assert not [r for r in emu.requests() if r["method"] in ("PUT", "PATCH", "POST")]
    assert emulator_target(emu, cluster_id) == 0


async def test_attach_by_name_and_unknown_cluster(jp_fetch: Any, emu: EmulatorHandle):
    await jp_fetch("tgnb", "cluster")
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("tgnb", "attach", method="POST", body=json.dumps({"cluster": "nope"}))
    assert err.value.code == 404
    assert err.value.response is not None
    assert "tgnb-demo" in body(err.value.response)["message"]
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("tgnb", "attach", method="POST", body=json.dumps({"cluster": 3}))
    assert err.value.code == 400
    from tgnb.cloud import Cloud

    with Cloud(api_key=emu.api_key, base_url=emu.base_url, project_id=emu.project_id) as cloud:
        other = cloud.create("other-cluster")
    c = body(
        await jp_fetch(
            "tgnb", "attach", method="POST", body=json.dumps({"cluster": "other-cluster"})
        )
    )
    assert (c["name"], c["id"]) == ("other-cluster", other.id)
    assert body(await jp_fetch("tgnb", "cluster"))["id"] == other.id


async def test_runs_empty_then_unknown_run_is_404(jp_fetch: Any, emu: EmulatorHandle):
    assert body(await jp_fetch("tgnb", "runs")) == {"runs": []}
    for path in (("tgnb", "runs", "nope"), ("tgnb", "runs", "nope", "timeline")):
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch(*path)
        assert err.value.code == 404
        assert err.value.response is not None
        assert "nope" in body(err.value.response)["message"]


async def test_event_stream_pushes_preemption_and_run_resume(
    jp_fetch: Any, emu: EmulatorHandle, standin: None
):
    from tgnb.session import attach

    await jp_fetch("tgnb", "scale", method="POST", body=json.dumps({"preemptible": 8}))
    first = await stream(jp_fetch, timeout=1.0)
    assert first, "the first read of the stream sends the current state"
    kinds = {m["type"] for _, m in first}
    assert {"cluster", "runs"} <= kinds
    # what happened before anybody listened is history: listed, never notified
    target = [m for _, m in first if m["type"] == "event" and m["event"]["reason"] == TARGET]
    assert target and not target[0]["live"]
    last = first[-1][0]

    session = attach(local=True, home=emu.home)
    done = session.scale(preemptible=8, wait=True, timeout=60, poll=0.2)
    assert done, done
    run = session.launch("grpo", name="sse-run", max_steps=400)
    wait_until(lambda: run.records("metrics"), timeout=60)
    node = run.status.nodes[0]
    emu.preempt(session.cluster.id, node)
    wait_until(lambda: any(e.reason == RUN_RESUMED for e in run.run_events()), timeout=90)

    seen: list[dict[str, Any]] = []

    async def notified() -> bool:
        nonlocal last
        got = await stream(jp_fetch, since=last, timeout=1.0)
        if got:
            last = got[-1][0]
        seen.extend(m for _, m in got)
        reasons = {m["event"]["reason"] for m in seen if m["type"] == "event" and m["live"]}
        return {PREEMPTION_NOTIFIED, RUN_RESUMED} <= reasons

    await async_wait_until(notified, 60, what="the notice and the resume")
    notice = next(
        m["event"]
        for m in seen
        if m["type"] == "event" and m["event"]["reason"] == PREEMPTION_NOTIFIED
    )
    assert notice["node"] == node
    runs = [m["runs"] for m in seen if m["type"] == "runs"][-1]
    assert runs[0]["name"] == "sse-run" and runs[0]["max_steps"] == 400
    assert runs[0]["step"] > 0 and 0 < runs[0]["progress"] <= 1
    # the sidebar's dollars: the run's so far at the cluster's prices, which the cluster carries
    assert runs[0]["cost_usd"] > 0 and runs[0]["gpu_hours"] > 0 and runs[0]["budget_usd"] is None
    cluster = [m["cluster"] for m in seen if m["type"] == "cluster"][-1]
    assert cluster["prices"]["source"] == "the platform's API"
    assert cluster["prices"]["preemptible"] > 0

    one = body(await jp_fetch("tgnb", "runs", "sse-run"))
    assert RUN_RESUMED in {e["reason"] for e in one["events"]}
    assert next(h["state"] for h in one["history"]) == "pending"
    svg = await jp_fetch("tgnb", "runs", "sse-run", "timeline")
    assert svg.headers["Content-Type"] == "image/svg+xml"
    assert svg.body.startswith(b"<svg") and b"sse-run" in svg.body
    run.stop()


async def test_status_and_stream_never_attach_by_themselves(jp_fetch: Any, emu: EmulatorHandle):
    """Opening JupyterLab (status, event stream) starts nothing: no cluster read or created."""
    assert body(await jp_fetch("tgnb", "status")) == {"attached": False, "cluster": None}
    assert await stream(jp_fetch, timeout=0.6) == []
    assert emu.requests() == []
    await jp_fetch("tgnb", "cluster")
    status = body(await jp_fetch("tgnb", "status"))
    assert status["attached"] is True and status["cluster"]["name"] == "tgnb-demo"


@pytest.mark.slow
async def test_a_run_that_fails_is_pushed_as_a_state_change(
    jp_fetch: Any, emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
):
    """The browser's 'run failed' notification comes from this ``run_state`` message."""
    from tgnb.session import attach

    await jp_fetch("tgnb", "scale", method="POST", body=json.dumps({"preemptible": 8}))
    last = (await stream(jp_fetch, timeout=0.5))[-1][0]
    # a training module that does not exist: the process exits 1 and the run fails for real
    monkeypatch.setenv("TGNB_TRAIN_MODULE", "tgnb_no_such_trainer")
    listening = asyncio.ensure_future(stream(jp_fetch, since=last, timeout=20.0))

    def launch_and_wait() -> str:
        session = attach(local=True, home=emu.home)
        assert session.scale(preemptible=8, wait=True, timeout=60, poll=0.2)
        # no restart of the failure (the default policy retries it 3 times, past this stream)
        run = session.launch("grpo", name="doomed", max_steps=5, recovery={"max_restarts": 0})
        return run.wait(timeout=60).state.value

    # blocking calls off the event loop, which serves the Jupyter server meanwhile
    assert await asyncio.to_thread(launch_and_wait) == "failed"
    seen = [m for _, m in await listening]
    changes = [m for m in seen if m["type"] == "run_state" and m["run"] == "doomed"]
    assert changes and changes[-1]["to"] == "failed", seen
    assert changes[-1]["from"] in (None, "pending", "running")
    runs = body(await jp_fetch("tgnb", "runs"))["runs"]
    assert [(r["name"], r["state"], r["finished"]) for r in runs] == [("doomed", "failed", True)]


async def test_leftovers_with_none_left_sends_no_request(
    jp_fetch: Any, emu: EmulatorHandle, tgnb_home: Any, monkeypatch: pytest.MonkeyPatch
):
    """The sidebar's look for Post-Training leftovers (`serialize.leftovers_json`): with no
    registry entry whose process is gone it answers from the tgnb home alone, attaching nothing
    (the browser test tests/lab/test_sidebar_leftovers.py lists a real leftover)."""
    monkeypatch.setenv("TGNB_HOME", str(tgnb_home))
    r = await jp_fetch("tgnb", "posttraining", "leftovers")
    assert body(r) == {"leftovers": [], "stop": "tgnb pt stop --leftovers"}
    status = body(await jp_fetch("tgnb", "status"))
    assert status["attached"] is False  # the look attached no session
