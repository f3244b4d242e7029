"""The sidebar's live log (issue 47 §3): ``GET /tgnb/runs/<name>/logs`` on a real Jupyter server
attached to a real emulator gives a run's output after a cursor as ``run.logs(follow=True)``
shows it: each attempt headed with its node, start and how the one before ended (from the
engine's ``JobPlaced`` / ``JobReleased``), every line of the program once, the run's end last."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import JOB_PLACED
from tgnb.runs import livelog

from .conftest import body

PLAIN = """\
    import sys, time

    steps = int(sys.argv[1])
    for step in range(1, steps + 1):
        time.sleep(0.05)
        print(f"step {step}", flush=True)
    print("done", flush=True)
"""


async def read_pages(jp_fetch: Any, name: str, limit: float = 300.0) -> tuple[list[Any], int]:
    """Poll the route as the sidebar does, until it says done: every line, and the pages read."""
    cursor, attempt, lines, pages = 0, -1, [], 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while loop.time() < deadline:
        got = body(
            await jp_fetch(
                "tgnb", "runs", name, "logs", params={"cursor": cursor, "attempt": attempt}
            )
        )
        pages += 1
        lines += got["lines"]
        cursor, attempt = got["cursor"], got["attempt"]
        if got["done"]:
            return lines, pages
        await asyncio.sleep(0.2)
    raise AssertionError(f"the log of {name} was not done after {limit} s: {lines[-3:]}")


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_log_route_heads_each_attempt_and_gives_every_line_once(
    jp_fetch: Any, emu: EmulatorHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.session import attach

    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(PLAIN))
    session = attach(local=True, home=emu.home)
    assert await asyncio.to_thread(session.scale, preemptible=8, wait=True, timeout=60, poll=0.2)
    run = session.launch("train.py", args=["60"], workdir=wd, name="logged")
    await jp_fetch("tgnb", "cluster")  # the server's own session, on the same cluster

    def preempt_once() -> None:
        wait_until(lambda: len(run.logs()) >= 15 and run.status.nodes, timeout=240)
        session.preempt(run.status.nodes[0])

    preempting = asyncio.create_task(asyncio.to_thread(preempt_once))
    lines, pages = await read_pages(jp_fetch, "logged")
    await preempting
    assert pages > 1  # read while it ran, not once at its end
    assert run.refresh().state.value == "succeeded"

    kinds = [line["kind"] for line in lines]
    texts = [line["text"] for line in lines]
    placed = [e for e in run.run_events() if e.reason == JOB_PLACED]
    assert [e.data["restart_count"] for e in placed] == [0, 1], placed
    heads = [t for t, k in zip(texts, kinds, strict=True) if k == "attempt"]
    assert len(heads) == 2, heads
    assert heads[0].startswith(f"── attempt 1 on {placed[0].node}, started "), heads[0]
    assert heads[1].startswith("── attempt 2 on "), heads[1]
    assert heads[1].endswith("; attempt 1: preempted ──"), heads[1]
    assert kinds[0] == "attempt" and kinds.count("end") == 1 and kinds[-1] == "end"
    assert texts[-1] == f"── {run.closing_line()} ──"
    output = [t for t, k in zip(texts, kinds, strict=True) if k == "output"]
    assert output == run.logs()  # every line of both attempts, once, in order
    second = kinds.index("attempt", 1)
    assert texts[second + 1] == "step 1" and output[-1] == "done"

    # the same log read in pages of 64 bytes (lines cut across pages) reads the same
    monkeypatch.setattr(livelog, "PAGE_BYTES", 64)
    cursor, attempt, small = 0, -1, []
    for _ in range(10_000):
        got = livelog.page(run, cursor, attempt)
        small += got.lines
        cursor, attempt = got.cursor, got.attempt
        if got.done:
            break
    assert [k for k, _ in small] == kinds
    assert [t for k, t in small if k == "output"] == output


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"cursor": "x"}, "integers"),
        ({"cursor": -1}, "cursor must be >= 0"),
        ({"attempt": -2}, "attempt >= -1"),
    ],
)
async def test_the_log_route_refuses_a_bad_cursor(
    jp_fetch: Any, emu: EmulatorHandle, params: dict[str, Any], needle: str
) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("tgnb", "runs", "any", "logs", params=params)
    assert err.value.code == 400 and err.value.response is not None
    assert needle in body(err.value.response)["message"]


async def test_the_log_of_an_unknown_run_is_404(jp_fetch: Any, emu: EmulatorHandle) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("tgnb", "runs", "nope", "logs")
    assert err.value.code == 404 and err.value.response is not None
    assert "nope" in body(err.value.response)["message"]
