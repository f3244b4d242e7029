"""What the notebook surface prints reads like the rest of Jupyter: ``%tg preempt``'s one-line
result and refusal (no raw JSON, no internal path), fixes named as ``%tg`` lines, event columns as
wide as node names, plurals, round axis labels, whole timeline labels and markers a second apart
drawn apart, and ``tgnb`` alone exiting non-zero. Magics run in a real IPython shell against a real
emulator daemon."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from IPython.core.error import UsageError

from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import Event
from tgnb.notebook._plot import curve_svg
from tgnb.notebook._svg import _lane_label
from tgnb.notebook._wording import as_magic
from tgnb.notebook.tables import events_text
from tgnb.notebook.timeline import EventTimeline
from tgnb.notebook.widgets import _count

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
SVG = "{http://www.w3.org/2000/svg}"
NODE = "gpu-preemptible-dp-daacfafa-0"


def test_preempt_returns_one_line_and_refuses_in_words(
    ip: Any, tg: Any, attached: EmulatorHandle
) -> None:
    result = ip.run_line_magic("tg", "scale --preemptible 8 --wait --timeout 60s")
    assert re.fullmatch(
        r"WaitResult\(reached=True, cluster='tgnb-demo', allocated=8, desired=8, "
        r"waited=\d+\.\d, polls=\d+\)",
        repr(result),
    )
    node = result.state.preemptible_nodes[0].name
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("tg", "preempt bogus")
    text = str(refused.value)
    assert text.startswith("%tg preempt: cannot preempt bogus: node 'bogus' not found")
    assert f"running preemptible nodes: {node}" in text
    assert "{" not in text and '"code"' not in text
    done = ip.run_line_magic("tg", f"preempt {node}")
    assert re.fullmatch(
        rf"<Preemption {node}: notice at \d\d:\d\d:\d\dZ, removed at \d\d:\d\d:\d\dZ, "
        r"a \d+ s drain window>",
        repr(done),
    )


def test_magic_errors_name_magic_lines(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("tg", "launch grpo --steps 5")
    text = str(refused.value)
    assert "%tg scale --preemptible 8" in text and "--standard" in text
    assert "session." not in text and "preemptible=False" not in text
    assert as_magic("ask for nodes<=2, or use gpus_per_node<=8") == (
        "ask for --nodes 2 or less, or use --gpus-per-node 8 or less"
    )


def test_event_columns_fit_long_node_names() -> None:
    events = [
        Event(T0, "cluster", "TogetherPreemptionNotified", node=NODE + "-and-more", run=None),
        Event(T0, "run", "RunResumed", node="n", run="grpo-quickstart-run-1"),
    ]
    lines = events_text(events).splitlines()
    col = lines[0].index("RUN")  # the RUN column starts at one offset on every line
    assert lines[1][col:] == "-" and lines[2][col:] == "grpo-quickstart-run-1", lines
    assert f"{NODE}-and-more " in lines[1]


def test_plurals_round_axes_and_whole_labels() -> None:
    assert [_count(n, "resume") for n in (0, 1, 2)] == ["0 resumes", "1 resume", "2 resumes"]
    svg = curve_svg("loss", [(1, -1.86e-08), (2, 0.0), (3, 1e-9)])
    assert "e-0" not in svg
    svg = curve_svg("loss", [(1, 0.0123), (2, 0.3456)])
    labels = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    assert labels[:2] == ["0.4", "0"], labels
    assert _lane_label(NODE) == NODE
    long = "gpu-preemptible-dp-daacfafa-12345-long-0"
    assert _lane_label(long) == "gpu-…-dp-daacfafa-12345-long-0"


def test_markers_a_second_apart_are_drawn_apart() -> None:
    def at(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    story = [
        Event(at(0), "cluster", "TogetherNodeAdded", node=NODE),
        Event(at(5), "run", "RunStarted", run="grpo-a", node=NODE),
        Event(at(300), "run", "SignalReceived", run="grpo-a", node=NODE),
        Event(at(300.5), "run", "CheckpointSaved", run="grpo-a", data={"step": 10}),
        Event(at(301), "run", "RunRequeued", run="grpo-a", node=NODE),
        Event(at(600), "run", "RunSucceeded", run="grpo-a", node=NODE),
    ]
    root = ET.fromstring(EventTimeline(story, now=at(600)).to_svg())
    lane = next(g for g in root.iter(f"{SVG}g") if g.get("data-key") == "grpo-a")
    xs = sorted(float(u.get("x", 0)) for u in lane.iter(f"{SVG}use"))
    assert len(xs) >= 3
    assert all(b - a >= 9.9 for a, b in itertools.pairwise(xs)), xs
    label = next(t for t in root.iter(f"{SVG}text") if (t.text or "").startswith("gpu-"))
    assert label.text == NODE


def test_tgnb_alone_exits_non_zero_with_usage() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tgnb.cli"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: tgnb COMMAND") and proc.stdout == ""
    ok = subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and ok.stdout.startswith("usage: tgnb COMMAND")
