"""The Post-Training panel's static rendering (what papermill and HTML exports keep) and the
resources' and sessions' lanes on the EventTimeline, from records as the API describes them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tgnb import events as ev
from tgnb.notebook.pt_panel import PanelState, render_html, render_text, session_rows
from tgnb.notebook.timeline import EventTimeline
from tgnb.posttraining.lifecycle import all_events
from tgnb.posttraining.metrics import MetricLog
from tgnb.posttraining.records import CheckpointInfo, Cost, ResourceInfo, SessionInfo

T0 = datetime(2026, 11, 30, 20, 0, tzinfo=timezone.utc)


def _resource(status: str = "READY") -> ResourceInfo:
    return ResourceInfo(
        "mr-1",
        "tgnb/tiny-llama",
        status,
        True,
        1,
        "B200-SXM",
        900,
        T0,
        T0 + timedelta(minutes=9),
        None,
        None,
        None,
    )


def _session(sid: str, name: str, status: str, step: int, ckpts: int = 0) -> SessionInfo:
    cks = tuple(
        CheckpointInfo(f"ck-{sid}-{i}", "inference", sid, step, T0 + timedelta(minutes=5 + i))
        for i in range(ckpts)
    )
    return SessionInfo(
        sid,
        "mr-1",
        name,
        status,
        step,
        step,
        step,
        8,
        16,
        cks,
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=8),
        None,
    )


def _state(tmp_path: Path) -> PanelState:
    sessions = [
        _session("ts-a", "lr-1e-4", "RUNNING", 3, 1),
        _session("ts-b", "lr-3e-4", "STOPPED", 3),
    ]
    metrics = {}
    for k, s in enumerate(sessions):
        log = MetricLog(tmp_path / f"{s.id}.jsonl")
        for step in range(4):
            log.operation("forward-backward")
            log.record(loss=2.0 - 0.1 * step * (k + 1))
            log.record(reward_mean=0.1 * step * (k + 1))
            log.set_step(step + 1)
        # what the panel reads back: the file, not the object
        metrics[s.id] = MetricLog(tmp_path / f"{s.id}.jsonl").rows
    cost = Cost("mr-1", 10.0, 2, 18.0, "USD", T0, None, False)
    return PanelState(_resource(), sessions, metrics, cost)


def test_rows_show_each_session_latest_state(tmp_path: Path) -> None:
    rows = session_rows(_state(tmp_path))
    assert rows[0] == ("lr-1e-4", "RUNNING", "3", "1.7", "0.3", "3", "4", "1", "r8")
    assert rows[1][:5] == ("lr-1e-4".replace("1e-4", "3e-4"), "STOPPED", "3", "1.4", "0.6")


def test_static_html_has_the_table_both_curves_and_the_cost(tmp_path: Path) -> None:
    state = _state(tmp_path)
    page = render_html(state)
    assert "resource mr-1" in page and "READY" in page
    assert "20.0 GPU-min" in page and "$3.00 so far" in page  # 10 min x 2 GPUs, $18/h
    assert page.count("<tr>") == 3  # head + 2 sessions
    # loss and reward plots, each with one series per session, on shared axes
    assert page.count('class="tgnb-curves"') == 2
    assert page.count('class="series"') == 4
    assert "lr-1e-4" in page and "lr-3e-4" in page
    assert "<script" not in page
    text = render_text(state)
    assert text.splitlines()[1].split()[:3] == ["SESSION", "STATUS", "STEP"]


def test_panel_without_metrics_says_so(tmp_path: Path) -> None:
    page = render_html(PanelState(_resource(), [], {}, None))
    assert "no sessions yet" in page and "no data yet" in page


def test_timeline_draws_resource_and_session_lanes() -> None:
    sessions = [
        _session("ts-a", "lr-1e-4", "RUNNING", 3, 2),
        _session("ts-b", "lr-3e-4", "EXPIRED", 3),
    ]
    usage = {"ready_at": (T0 + timedelta(seconds=30)).isoformat()}
    events = all_events(_resource(), sessions, usage)
    reasons = [e.reason for e in events]
    assert reasons.count(ev.SESSION_STARTED) == 2
    assert ev.RESOURCE_READY in reasons and ev.SESSION_EXPIRED in reasons
    assert reasons.count(ev.SESSION_CHECKPOINT) == 2
    assert all(e.source == "posttraining" for e in events)
    # Beside a cluster's node and a run's events, on one axis.
    events += [
        ev.Event(T0, "cluster", ev.NODE_ADDED, node="gpu-preemptible-dp-1"),
        ev.Event(
            T0 + timedelta(minutes=2),
            "run",
            ev.RUN_STARTED,
            run="grpo-1",
            node="gpu-preemptible-dp-1",
        ),
    ]
    tl = EventTimeline(events, now=T0 + timedelta(minutes=10))
    kinds = [lane.kind for lane in tl.lanes]
    assert kinds == ["preemptible", "run", "resource", "session", "session"]
    res_lane = tl.lanes[2]
    assert [s.kind for s in res_lane.spans] == ["provisioning", "resource"]
    expired = tl.lanes[4]
    assert expired.key.startswith("lr-3e-4") and not expired.spans[0].open
    assert tl.lanes[3].spans[0].open  # still running at `now`
    svg = tl.to_svg()
    assert "model resource" in svg and "training session" in svg
    assert len(re.findall(r'class="marker TrainingSessionCheckpoint"', svg)) >= 1


def test_a_session_driven_outside_tgnb_shows_unknown_operations() -> None:
    state = PanelState(_resource(), [_session("ts-c", "native", "RUNNING", 5)], {"ts-c": []}, None)
    row = session_rows(state)[0]
    assert (row[2], row[3], row[6]) == ("5", "-", "-")  # step from the API; loss, ops unknown


def test_metrics_survive_an_unwritable_home(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    log = MetricLog(blocker / "metrics" / "s.jsonl")
    log.record(loss=1.0)  # no exception: the training loop goes on
    log.record(loss=0.5)
    assert log.series("loss") == [(0.0, 1.0), (0.0, 0.5)]
    assert log.write_error is not None and log.path is None
