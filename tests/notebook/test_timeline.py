"""EventTimeline: lanes, lifetimes, drain windows and run segments, and its static SVG rendering."""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from tgnb.events import Event
from tgnb.notebook.timeline import EventTimeline, node_class, timeline

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SVG = "{http://www.w3.org/2000/svg}"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rel(t: float) -> float:
    return t - T0.timestamp()


STORY = [
    Event(at(0), "cluster", "TogetherNodeAdded", node="gpu-dp-0"),
    Event(at(10), "cluster", "TogetherNodeAdded", node="gpu-preemptible-dp-1"),
    Event(at(20), "run", "RunStarted", run="grpo-a", node="gpu-preemptible-dp-1"),
    Event(at(60), "run", "CheckpointSaved", run="grpo-a", data={"step": 10}),
    Event(at(100), "cluster", "TogetherPreemptionNotified", node="gpu-preemptible-dp-1"),
    Event(at(101), "run", "SignalReceived", run="grpo-a", node="gpu-preemptible-dp-1"),
    Event(at(110), "run", "CheckpointSaved", run="grpo-a", data={"step": 12}),
    Event(at(111), "run", "RunRequeued", run="grpo-a", node="gpu-preemptible-dp-1"),
    Event(at(400), "cluster", "TogetherPreempted", node="gpu-preemptible-dp-1"),
    Event(at(420), "cluster", "TogetherNodeAdded", node="gpu-preemptible-dp-2"),
    Event(at(450), "run", "RunResumed", run="grpo-a", node="gpu-preemptible-dp-2"),
    Event(at(600), "cluster", "TogetherPreemptionNotified", node="gpu-preemptible-dp-2"),
]


def test_node_class_by_name_prefix() -> None:
    assert node_class("gpu-preemptible-dp-7") == "preemptible"
    assert node_class("gpu-dp-0") == "standard"


def test_lanes_lifetimes_and_drain_windows() -> None:
    tl = EventTimeline(reversed(STORY), now=at(700))
    lanes = {ln.key: ln for ln in tl.lanes}
    assert [ln.key for ln in tl.lanes] == [
        "gpu-dp-0",
        "gpu-preemptible-dp-1",
        "gpu-preemptible-dp-2",
        "grpo-a",
    ]
    assert lanes["gpu-dp-0"].kind == "standard"
    assert lanes["gpu-preemptible-dp-1"].kind == "preemptible"

    def spans(key: str, kind: str) -> list[tuple[float, float, bool]]:
        return [(rel(s.start), rel(s.end), s.open) for s in lanes[key].spans if s.kind == kind]

    # The standard node lives until now; the first preemptible node until its removal.
    assert spans("gpu-dp-0", "standard") == [(0, 700, True)]
    assert spans("gpu-preemptible-dp-1", "preemptible") == [(10, 400, False)]
    # Drain window from notice to removal, or notice + 300 s while the removal is not seen.
    assert spans("gpu-preemptible-dp-1", "drain") == [(100, 400, False)]
    assert spans("gpu-preemptible-dp-2", "drain") == [(600, 900, True)]
    # The run: on node 1 from start to requeue, then on node 2 from resume until now.
    assert spans("grpo-a", "run") == [(20, 111, False), (450, 700, True)]
    assert spans("gpu-preemptible-dp-2", "occupied") == [(450, 700, True)]
    reasons = [m.reason for m in lanes["grpo-a"].markers]
    assert reasons.count("CheckpointSaved") == 2 and "RunResumed" in reasons
    assert tl.preemptions == 2
    assert "2 preemptions" in repr(tl)


def test_drain_window_length_is_configurable() -> None:
    tl = EventTimeline(STORY, now=at(700), drain_window=30)
    lane = next(ln for ln in tl.lanes if ln.key == "gpu-preemptible-dp-2")
    assert [(rel(s.start), rel(s.end)) for s in lane.spans if s.kind == "drain"] == [(600, 630)]


def test_svg_is_well_formed_with_lanes_and_shaded_windows() -> None:
    tl = timeline([e.to_dict() for e in STORY], now=at(700), title="quickstart")
    svg = tl._repr_svg_()
    root = ET.fromstring(svg)
    lanes = [g for g in root.iter(f"{SVG}g") if "lane" in (g.get("class") or "").split()]
    assert {g.get("data-key") for g in lanes} == {
        "gpu-dp-0",
        "gpu-preemptible-dp-1",
        "gpu-preemptible-dp-2",
        "grpo-a",
    }
    classes = [r.get("class") or "" for r in root.iter(f"{SVG}rect")]
    assert sum(c == "span drain" for c in classes) == 2
    assert any(c == "span preemptible" for c in classes)
    assert any(c == "span standard" for c in classes)
    assert "url(#tgnb-hatch)" in svg
    html = tl._repr_html_()
    assert html.startswith("<div") and "<svg" in html


def test_axis_labels_in_the_display_time_zone() -> None:
    utc = EventTimeline(STORY, now=at(700), tz="UTC").to_svg()
    tokyo = EventTimeline(STORY, now=at(700), tz="Asia/Tokyo").to_svg()
    assert "time (UTC)" in utc and "12:0" in utc
    assert "time (JST)" in tokyo and "21:0" in tokyo


def test_tooltips_escape_messages() -> None:
    evil = Event(
        at(5), "cluster", "TogetherPreemptionNotified", "<script>x</script>", node="gpu-dp-0"
    )
    svg = EventTimeline([*STORY, evil], now=at(700)).to_svg()
    assert "<script>" not in svg
    ET.fromstring(svg)


def test_empty_timeline_renders() -> None:
    ET.fromstring(EventTimeline([], now=T0).to_svg())


@pytest.mark.parametrize("seed", [1])
def test_ten_thousand_events_are_merged_and_culled(seed: int) -> None:
    rng = random.Random(seed)
    events = []
    for _ in range(10_000):
        t = at(rng.random() * 86_400)
        if rng.random() < 0.5:
            node = f"gpu-preemptible-dp-{rng.randrange(120)}"
            reason = rng.choice(
                ["TogetherNodeAdded", "TogetherPreemptionNotified", "TogetherPreempted"]
            )
            events.append(Event(t, "cluster", reason, node=node))
        else:
            reason = rng.choice(["CheckpointSaved", "CheckpointSaved", "RunResumed"])
            events.append(Event(t, "run", reason, run=f"run-{rng.randrange(8)}"))
    tl = EventTimeline(events, now=at(86_400), max_lanes=30)
    assert sum(tl.hidden.values()) == 90
    root = ET.fromstring(tl.to_svg())
    markers = [g for g in root.iter() if (g.get("class") or "").startswith("marker")]
    assert 0 < len(markers) <= 2_500
    assert root.find(f".//{SVG}text[@class='hidden-lanes']") is not None


def test_a_runs_timeline_is_fitted_to_the_run() -> None:
    """A node made an hour before the run: with `fit_runs` (what `timeline(run)` and the
    sidebar's timeline tab use) the axis starts at the run, not at the node's creation, and the
    node's lane is drawn from the left edge."""
    early = [Event(at(-3600), "cluster", "TogetherNodeAdded", node="gpu-preemptible-dp-0")]
    run = [
        Event(at(0), "run", "RunStarted", run="grpo-b", node="gpu-preemptible-dp-0"),
        Event(at(60), "run", "RunExited", run="grpo-b", node="gpu-preemptible-dp-0"),
    ]
    whole = EventTimeline(early + run, now=at(120))
    fitted = EventTimeline(early + run, now=at(120), fit_runs=True)
    assert rel(whole.bounds()[0]) == -3600
    assert rel(fitted.bounds()[0]) == 0 and rel(fitted.bounds()[1]) == 60
    root = ET.fromstring(fitted.to_svg())
    spans = [r for r in root.iter(f"{SVG}rect") if (r.get("class") or "").startswith("span")]
    run_span = next(r for r in spans if r.get("class") == "span run")
    assert float(run_span.get("width") or 0) > 600  # the run fills the plot, not its right edge
    node_span = next(r for r in spans if r.get("class") == "span preemptible")
    assert float(node_span.get("x") or 0) >= float(run_span.get("x") or 0) - 20


def test_markers_at_one_instant_are_grouped_with_a_count() -> None:
    """Signal, checkpoint, requeue and resume within a second (a preemption handled well) sit on
    one spot of the run's lane: drawn as one marker with "×4" and all four in its tooltip."""
    events = [
        Event(at(0), "run", "RunStarted", run="grpo-c", node="gpu-preemptible-dp-1"),
        Event(at(1000), "run", "SignalReceived", run="grpo-c", node="gpu-preemptible-dp-1"),
        Event(at(1000.2), "run", "CheckpointSaved", run="grpo-c", data={"step": 9}),
        Event(at(1000.4), "run", "RunRequeued", run="grpo-c", node="gpu-preemptible-dp-1"),
        Event(at(1000.9), "run", "RunResumed", run="grpo-c", node="gpu-preemptible-dp-2"),
        Event(at(3000), "run", "RunExited", run="grpo-c", node="gpu-preemptible-dp-2"),
    ]
    root = ET.fromstring(EventTimeline(events, now=at(3000)).to_svg())
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "marker-group"]
    assert len(groups) == 1 and groups[0].get("data-count") == "4"
    text = "".join(groups[0].itertext())
    assert "×4" in text
    for word in ("signal", "checkpoint", "requeued", "resumed"):
        assert word in text.lower(), text
    # the legend explains the count, and lists the markers drawn, not every kind there is
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend-marker"]
    assert "×N: N events at one moment (hover for each)" in legend
    assert "preemption notice" not in legend and "target changed" not in legend, legend


def test_the_legend_lists_only_the_markers_drawn() -> None:
    events = [
        Event(at(0), "run", "RunStarted", run="grpo-e", node="gpu-preemptible-dp-1"),
        Event(at(500), "run", "RunExited", run="grpo-e", node="gpu-preemptible-dp-1"),
    ]
    root = ET.fromstring(EventTimeline(events, now=at(600)).to_svg())
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend-marker"]
    assert len(legend) == 2 and not any(t and t.startswith("×N") for t in legend), legend


def test_a_fitted_axis_reaches_the_end_of_a_drain_window_begun_on_it() -> None:
    """The run finished elsewhere before the preempted node's removal: the drain window is drawn
    whole, not cut at the run's end."""
    events = [
        Event(at(-100), "cluster", "TogetherNodeAdded", node="gpu-preemptible-dp-1"),
        Event(at(0), "run", "RunStarted", run="grpo-f", node="gpu-preemptible-dp-1"),
        Event(at(50), "cluster", "TogetherPreemptionNotified", node="gpu-preemptible-dp-1"),
        Event(at(60), "run", "RunExited", run="grpo-f", node="gpu-preemptible-dp-1"),
        Event(at(350), "cluster", "TogetherPreempted", node="gpu-preemptible-dp-1"),
    ]
    fitted = EventTimeline(events, now=at(400), fit_runs=True)
    assert rel(fitted.bounds()[0]) == 0 and rel(fitted.bounds()[1]) == 350


def test_recovery_decisions_have_their_own_marker_tooltip_and_legend() -> None:
    """A `RecoveryDecided` (the supervisor's, source tgnb) is drawn on the run's lane with its own
    symbol, its reason in the tooltip and a legend entry; it was drawn as a checkpoint."""
    decided = Event(
        at(250),
        "tgnb",
        "RecoveryDecided",
        "shrunk to 1 node: 8 of 16 preemptible GPUs allocated for 10 min",
        run="grpo-a",
        data={"action": "start", "nodes": 1},
    )
    failed = Event(at(330), "tgnb", "RunFailedRestarting", "exit 1, failure 1 of 3", run="grpo-a")
    svg = EventTimeline([*STORY, decided, failed], now=at(700)).to_svg()
    root = ET.fromstring(svg)
    uses = {u.get("class"): u for u in root.iter(f"{SVG}use")}
    mark = uses["marker RecoveryDecided"]
    assert mark.get("{http://www.w3.org/1999/xlink}href") == "#tgnb-m-RecoveryDecided"
    tip = "".join(mark.itertext())
    assert "recovery decision" in tip and "shrunk to 1 node: 8 of 16 preemptible GPUs" in tip
    assert (
        uses["marker RunFailedRestarting"].get("{http://www.w3.org/1999/xlink}href")
        == "#tgnb-m-RunFailedRestarting"
    )
    tl = EventTimeline([*STORY, decided, failed], now=at(700))
    run_lane = next(ln for ln in tl.lanes if ln.kind == "run")
    reasons = [m.reason for m in run_lane.markers]
    assert "RecoveryDecided" in reasons and "RunFailedRestarting" in reasons  # the run's lane
    legend = [t.text for t in root.iter(f"{SVG}text")]
    ys = {float(t.get("y") or 0) for t in root.iter(f"{SVG}text") if t.text == "failed, restarting"}
    assert max(ys) < float(root.get("height") or 0)  # wrapped inside the picture, not cut off
    assert "recovery decision" in legend and "failed, restarting" in legend
    plain = [
        t.text for t in ET.fromstring(EventTimeline(STORY, now=at(700)).to_svg()).iter(f"{SVG}text")
    ]
    assert "recovery decision" not in plain  # only when the timeline has one


def test_each_checkpoint_interval_announced_is_drawn_and_named() -> None:
    """An attempt's first interval (from a guessed stall) and the one measured 4 s later, on an
    hour's axis (the same 3 pixels): two markers, each interval in its own tooltip, and a legend
    entry; before, one marker said only the first (×2)."""
    said = [
        "checkpoint every 146 steps (8 s): a save should pause training about 0.00079 s",
        "checkpoint every 382 steps (20 s), was 146 (8 s): a save pauses training 0.0056 s",
    ]
    events = [
        Event(at(0), "run", "RunStarted", run="loop-a", node="gpu-preemptible-dp-1"),
        Event(
            at(10),
            "run",
            "CheckpointIntervalChosen",
            said[0],
            run="loop-a",
            data={"step": 2, "every_steps": 146},
        ),
        Event(
            at(14),
            "run",
            "CheckpointIntervalChosen",
            said[1],
            run="loop-a",
            data={"step": 148, "every_steps": 382},
        ),
        Event(at(3600), "run", "RunExited", run="loop-a", node="gpu-preemptible-dp-1"),
    ]
    root = ET.fromstring(EventTimeline(events, now=at(3600)).to_svg())
    marks = [
        u for u in root.iter(f"{SVG}use") if u.get("class") == "marker CheckpointIntervalChosen"
    ]
    tips = ["".join(u.itertext()) for u in marks]
    assert len(marks) == 2, tips
    assert said[0] in tips[0] and "step 2" in tips[0], tips
    assert said[1] in tips[1] and "step 148" in tips[1], tips
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend-marker"]
    assert "checkpoint interval" in legend, legend


def test_every_marker_drawn_has_a_legend_entry_and_the_notice_is_not_the_signal() -> None:
    """Every symbol a marker is drawn with is in the legend (the backend's job events, budget and
    Post-Training markers were left out, three of them in the tour), and the preemption notice and
    the program's signal are told apart (both were red down-triangles)."""
    from tgnb.events import (
        BUDGET_NOTICE,
        JOB_PLACED,
        JOB_RELEASED,
        PREEMPTION_NOTIFIED,
        SIGNAL_RECEIVED,
        SIGNAL_SENT,
    )
    from tgnb.notebook._lanes import MARKER_STYLE

    node = "gpu-preemptible-dp-1"
    events = [
        Event(at(0), "run", "RunStarted", run="grpo-l", node=node),
        Event(at(5), "backend", JOB_PLACED, run="grpo-l", node=node),
        Event(at(100), "cluster", PREEMPTION_NOTIFIED, node=node),
        Event(at(130), "backend", SIGNAL_SENT, run="grpo-l", node=node),
        Event(at(160), "run", SIGNAL_RECEIVED, run="grpo-l", node=node),
        Event(at(200), "run", "CheckpointSaved", run="grpo-l", data={"step": 4}),
        Event(at(260), "run", BUDGET_NOTICE, run="grpo-l"),
        Event(at(300), "run", "SomethingNewOfTheProgram", run="grpo-l"),
        Event(at(400), "run", "RunExited", run="grpo-l", node=node),
        Event(at(420), "backend", JOB_RELEASED, run="grpo-l", node=node),
    ]
    root = ET.fromstring(EventTimeline(events, now=at(500)).to_svg())
    href = "{http://www.w3.org/1999/xlink}href"
    uses = list(root.iter(f"{SVG}use"))
    drawn = {u.get(href) for u in uses if (u.get("class") or "").startswith("marker ")}
    legend = {u.get(href) for u in uses if u.get("class") == "legend-symbol"}
    assert len(drawn) >= 10, drawn

    def style(ref: str | None) -> object:
        symbol = (ref or "").removeprefix("#tgnb-m-")
        return MARKER_STYLE.get(symbol, symbol)  # kinds drawn alike share one entry

    assert {style(r) for r in drawn} <= {style(r) for r in legend}, (drawn, legend)
    labels = [t.text or "" for t in root.iter(f"{SVG}text") if t.get("class") == "legend-marker"]
    for word in (
        "preemption notice",
        "signal",
        "job placed",
        "SIGTERM sent",
        "80 % of budget",
        "job released",
        "other event",
    ):
        assert any(word in label for label in labels), (word, labels)
    assert MARKER_STYLE[PREEMPTION_NOTIFIED] != MARKER_STYLE[SIGNAL_RECEIVED]
    assert not any("preemption notice" in x and "signal" in x for x in labels), labels
    # the one a program's own reason is drawn with is not a checkpoint's (it was)
    other = next(u for u in uses if u.get("class") == "marker SomethingNewOfTheProgram")
    assert other.get(href) != "#tgnb-m-CheckpointSaved"
