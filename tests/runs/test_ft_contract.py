"""The replica groups' contract (`tgnb.runs.ft`) and the engine's reading of the lighthouse's
quorums (`tgnb.backends.local.quorums`), on lines TorchFT 0.2.0's lighthouse wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.local.quorums import GROUPS_COLUMN, QuorumReader, StepRows, group_of, parse
from tgnb.events import GROUP_HEALED, QUORUM_CHANGED, RUN_STARTED, Event, utcnow
from tgnb.runs import ft


def quorum_line(qid: int, members: list[tuple[str, int]], seconds: int) -> str:
    parts = ", ".join(
        f'QuorumMember {{ replica_id: "{rid}", address: "http://vm:1", store_address: "localhost:2", '
        f'step: {step}, world_size: 1, shrink_only: false, commit_failures: 0, data: "" }}'
        for rid, step in members
    )
    return (
        "2026-12-07T00:43:34.740 [INFO] [torchft::lighthouse] - Quorum! Quorum { "
        f"quorum_id: {qid}, participants: [{parts}], "
        f"created: Some(Timestamp {{ seconds: {seconds}, nanos: 500000000 }}) }}"
    )


def test_group_env_and_lighthouse_command() -> None:
    env = ft.group_env("http://10.0.0.1:29510", 1, 3)
    assert env[ft.LIGHTHOUSE_ENV] == "http://10.0.0.1:29510"
    assert (env[ft.REPLICA_GROUP_ENV], env[ft.NUM_GROUPS_ENV]) == ("1", "3")
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        ft.group_env("http://h:1", 3, 3)
    opts = ft.lighthouse_options({ft.HEARTBEAT_TIMEOUT_ENV: "500"})
    cmd = ft.lighthouse_command("[::]:29510", opts)
    assert cmd[cmd.index("--heartbeat_timeout_ms") + 1] == "500"
    assert cmd[-2:] == ["--bind", "[::]:29510"]
    with pytest.raises(ValueError, match=f"{ft.JOIN_TIMEOUT_ENV}=2000"):
        ft.lighthouse_options({ft.JOIN_TIMEOUT_ENV: "soon"})


def test_quorums_become_group_events(tmp_path: Path) -> None:
    assert group_of("group_12:0e1d1f4e-a817") == 12 and group_of("anon:uuid") is None
    q = parse(quorum_line(2, [("g0:a", 3), ("g1:b", 0)], 100))
    assert q is not None and q.step == 3 and q.created == 100.5
    assert parse("2026 [INFO] Quorum status: Fast quorum found!") is None
    seen: list[tuple[str, dict[str, Any]]] = []
    log = tmp_path / "lighthouse.log"
    reader = QuorumReader(log, lambda r, _m, d: seen.append((r, d)), {1: 95.0})
    lines = [
        quorum_line(1, [("g0:a", 0), ("g1:b", 0)], 90),
        quorum_line(1, [("g0:a", 1), ("g1:b", 1)], 91),  # the same groups: no event
        quorum_line(2, [("g0:a", 40)], 99),  # g1 gone: the survivor waited
        quorum_line(3, [("g0:a", 42), ("g1:c", 0)], 101),  # a replacement heals from g0
    ]
    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])  # a line half written
    reader.poll()
    log.write_text("\n".join(lines) + "\n")
    reader.poll()
    assert [r for r, _ in seen] == [QUORUM_CHANGED, QUORUM_CHANGED, QUORUM_CHANGED, GROUP_HEALED]
    assert seen[1][1] == {"groups": [0], "step": 40, "quorum_id": 2, "waited_s": 8.0}
    healed = seen[3][1]
    assert (healed["group"], healed["source"], healed["step"], healed["took_s"]) == (1, 0, 42, 6.5)


def test_the_quorums_steps_become_rows_for_a_program_that_writes_none(tmp_path: Path) -> None:
    """A program that never imports tgnb gets the quorum's steps as metrics rows (one a second
    of quorums at most, the last at the end: its step + 1 once the run finished); a program
    with tgnb's hook (its own ``RunStarted``) gets none."""
    metrics, events = tmp_path / "metrics.jsonl", tmp_path / "events.jsonl"
    rows = StepRows(metrics, events)
    reader = QuorumReader(tmp_path / "lighthouse.log", lambda *_: None, each=rows.seen)
    lines = [quorum_line(i + 1, [("g0:a", i), ("g1:b", i)], 90 + i // 4) for i in range(12)]
    lines.append(quorum_line(13, [("g0:a", 12)], 95))  # g1 gone
    reader.path.write_text("\n".join(lines) + "\n")
    reader.poll()
    rows.flush(finished=True)
    got = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["step"], r[GROUPS_COLUMN]) for r in got] == [
        (0, 2),
        (4, 2),
        (8, 2),
        (12, 1),
        (13, 1),
    ]
    rows.flush(finished=True)  # nothing new: nothing written
    assert len(metrics.read_text().splitlines()) == 5

    hooked = tmp_path / "hooked"
    hooked.mkdir()
    started = Event(utcnow(), "run", RUN_STARTED, "started script", run="r")
    (hooked / "events.jsonl").write_text(started.to_json() + "\n")
    rows = StepRows(hooked / "metrics.jsonl", hooked / "events.jsonl")
    reader = QuorumReader(reader.path, lambda *_: None, each=rows.seen)
    reader.poll()
    rows.flush(finished=True)
    assert not (hooked / "metrics.jsonl").exists()


def test_group_events_are_drawn_on_the_run_lane() -> None:
    from datetime import datetime, timezone

    from tgnb.events import GROUP_LEFT, Event
    from tgnb.notebook.timeline import EventTimeline

    t = datetime(2026, 12, 7, 1, 0, tzinfo=timezone.utc)
    left = Event(t, "tgnb", GROUP_LEFT, "group 1 left: notice", node="gpu-preemptible-dp-1",
                 run="ft", data={"group": 1, "cause": "notice"})  # fmt: skip
    lanes = {ln.key: ln for ln in EventTimeline([left], now=t).lanes}
    assert [m.reason for m in lanes["ft"].markers] == [GROUP_LEFT]
    assert not lanes["gpu-preemptible-dp-1"].markers
