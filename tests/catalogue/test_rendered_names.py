"""Hostile names through every renderer (issue 24, items 1 and 23), and malformed lines of a run's
``events.jsonl`` through every reader (item 9).

Rendered names: the strings come from where they come in real use — an ``events.jsonl`` line (a
reason, a message, a node) read by the run's own reader, a node name in the API's cluster record,
a Post-Training session's display name — and each renderer is the one a user sees: the timeline SVG
(`tgnb.timeline(run)`, what ``%tg events --timeline`` and the server's timeline route draw), its
HTML export (`EventTimeline.save`), the run, cluster and Post-Training panels' HTML, the text and
HTML tables, and the sidebar's JSON (`tgnb.server.serialize`, what the server extension sends). A
case holds when the markup parses, holds no element or attribute the payload tried to inject, and
no bidi control or NUL reaches the output. The SVG is parsed as XML (what browsers do with
image/svg+xml); the HTML with the standard library's HTML parser.

Malformed lines: one bad line among good ones, read by each reader: the trainer's resume
(`CheckpointGuard.restart_count`), `Run.run_events`, `Run.events`, the timeline, ``%tg events``'s
table (`Session.events`) and the sidebar's run JSON. Each must keep the good events and count the
bad line, never raise.
"""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tgnb import events as ev
from tgnb.backends.base import JobState, RunSpec
from tgnb.cloud.models import ClusterState
from tgnb.runs import Run, RunStore
from tgnb.train.record import Recorder

from .conftest import record

SCRIPT = '"><script>alert(1)</script><img src=x onerror="alert(2)">'
BIDI = "\u202e\u2066\u200f\u061c"
#: (id, reason, message, node name)
PAYLOADS: list[tuple[str, str, str, str]] = [
    ("script-in-reason", f"Evil{SCRIPT}", "ok", "gpu-preemptible-dp-1"),
    ("script-in-message", ev.CHECKPOINT_SAVED, f"step {SCRIPT}", "gpu-preemptible-dp-1"),
    ("script-in-node", ev.RUN_STARTED, "", f"gpu-preemptible-dp-{SCRIPT}"),
    ("bidi-everywhere", f"Run{BIDI}Started", f"exe.{BIDI}txt", f"gpu-dp-{BIDI}1"),
    ("nul-and-controls", "Bad\x00Reason\x07", "a\x00b\x1bc", "gpu-dp-\x00x"),
]
_BAD_CHARS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\x00-\x08\x0b\x0c\x0e-\x1f]")


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def _markup_problems(text: str, svg: bool) -> list[str]:
    problems = []
    if _BAD_CHARS.search(text):
        problems.append(f"control character {_BAD_CHARS.search(text)!r}")
    if svg:
        try:
            root = ET.fromstring(text)
        except ET.ParseError as exc:
            return [*problems, f"not XML: {exc}"]
        names = [el.tag.rsplit("}", 1)[-1] for el in root.iter()]
        attrs = [a.rsplit("}", 1)[-1] for el in root.iter() for a in el.attrib]
    else:
        parser = _Tags()
        parser.feed(text)
        names = [t for t, _ in parser.tags]
        attrs = [a for _, at in parser.tags for a, _ in at]
    if "script" in names or "img" in names:
        problems.append("an injected element")
    if any(a.lower().startswith("on") for a in attrs):
        problems.append("an injected event handler")
    return problems


def _plain_problems(text: str) -> list[str]:
    found = _BAD_CHARS.search(text)
    return [f"control character {found.group()!r}"] if found else []


def _json_problems(value: Any) -> list[str]:
    return _plain_problems(json.dumps(value, ensure_ascii=False))


def _run(tmp: Path, reason: str, message: str, node: str, lines: list[str] | None = None) -> Run:
    """A run in a real run store whose ``events.jsonl`` the training runtime's `Recorder` wrote,
    plus one line as a pod would print it with the hostile reason, message and node."""
    store = RunStore(tmp / "home")
    spec = RunSpec(name="grpo-names", train={"algorithm": "grpo", "max_steps": 10})
    run_dir = tmp / "runs" / "grpo-names"
    rec = store.create(spec, backend="local", cluster_id="c-1", run_dir=run_dir)
    Recorder(run_dir, run="grpo-names").event(ev.RUN_STARTED)
    Recorder(run_dir, run="grpo-names").metric(1, reward=0.5, loss=1.0)
    hostile = {
        "time": ev.format_time(ev.utcnow()),
        "source": "run",
        "reason": reason,
        "message": message,
        "node": node,
        "data": {"step": 1},
    }
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(hostile) + "\n")
        for line in lines or []:
            fh.write(line + "\n")
    store.set_state(rec.id, JobState.RUNNING, f"running {message}")
    return Run(store.get(rec.id), store)


def _cluster(node: str, message: str) -> ClusterState:
    now = ev.format_time(ev.utcnow())
    return ClusterState.from_api(
        {
            "cluster_id": "c-1",
            "cluster_name": f"cl{BIDI}",
            "cluster_type": "KUBERNETES",
            "status": "Ready",
            "gpu_worker_nodes": [
                {"host_name": node, "num_gpus": 8, "status": f"Ready{BIDI}"},
            ],
            "node_lifecycle_events": [
                {"node_id": node, "reason": ev.NODE_ADDED, "message": message, "timestamp": now}
            ],
        }
    )


def _svg(run: Run, tmp: Path) -> list[str]:
    from tgnb.notebook.timeline import timeline

    return _markup_problems(timeline(run, title=f"run {run.name}").to_svg(), svg=True)


def _html_export(run: Run, tmp: Path) -> list[str]:
    from tgnb.notebook.timeline import timeline

    path = tmp / "timeline.html"
    timeline(run).save(str(path))
    text = path.read_text(encoding="utf-8")
    svg = text[text.index("<svg") : text.rindex("</svg>") + 6]
    return _markup_problems(text, svg=False) + _markup_problems(svg, svg=True)


def _run_panel(run: Run, tmp: Path) -> list[str]:
    from tgnb.notebook.widgets import RunPanel

    panel = RunPanel(run, start=False)
    panel.refresh()
    return _markup_problems(panel.to_html(), svg=False) + _markup_problems(
        panel.header.value, svg=False
    )


def _cluster_panel(run: Run, tmp: Path) -> list[str]:
    from tgnb.notebook.widgets import ClusterPanel

    e = run.run_events()[-1]
    state = _cluster(e.node or "", e.message)
    panel = ClusterPanel(state, start=False)  # type: ignore[arg-type]
    panel.update(state)
    return (
        _markup_problems(panel.to_html(), svg=False)
        + _markup_problems(state._repr_html_(), svg=False)
        + _plain_problems(str(state))
    )


def _pt_panel(run: Run, tmp: Path) -> list[str]:
    from tgnb.notebook.pt_panel import PanelState, render_html
    from tgnb.posttraining.records import ResourceInfo, SessionInfo

    e = run.run_events()[-1]
    res = ResourceInfo(
        "res-1", f"tgnb/tiny{BIDI}", "READY", True, 1, None, 0, None, None, None, None, None
    )
    sess = SessionInfo(
        "s-1", "res-1", e.message + e.reason, "RUNNING", 1, 1, 1, 8, 16, (), None, None, None
    )
    state = PanelState(res, [sess], {"s-1": [{"step": 1, "loss": 0.5}]})
    return _markup_problems(render_html(state), svg=False)


def _tables(run: Run, tmp: Path) -> list[str]:
    from tgnb.notebook.commands.runs import runs_table
    from tgnb.notebook.tables import events_text

    evs = run.run_events()
    table = runs_table([run])
    return (
        _plain_problems(events_text(evs))
        + _markup_problems(table._repr_html_(), svg=False)
        + _plain_problems(str(table))
    )


def _sidebar_json(run: Run, tmp: Path) -> list[str]:
    from tgnb.server.serialize import cluster_json, event_json, run_json

    e = run.run_events()[-1]
    return (
        _json_problems(run_json(run, detail=True))
        + _json_problems([event_json(x) for x in run.run_events()])
        + _json_problems(cluster_json(_cluster(e.node or "", e.message)))
    )


RENDERERS: dict[str, Callable[[Run, Path], list[str]]] = {
    "svg-timeline": _svg,
    "html-export": _html_export,
    "run-panel": _run_panel,
    "cluster-panel": _cluster_panel,
    "pt-panel": _pt_panel,
    "tables": _tables,
    "sidebar-json": _sidebar_json,
}


@pytest.mark.parametrize("renderer", list(RENDERERS))
@pytest.mark.parametrize("payload", PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_rendered_names_are_escaped(
    renderer: str, payload: tuple[str, str, str, str], tmp_path: Path
) -> None:
    _, reason, message, node = payload
    run = _run(tmp_path, reason, message, node)
    problems = RENDERERS[renderer](run, tmp_path)
    record(not problems)
    assert not problems, problems


#: (id, the bad line among good ones)
BAD_LINES: list[tuple[str, str]] = [
    ("no-time", json.dumps({"source": "run", "reason": ev.CHECKPOINT_SAVED})),
    ("bad-time", json.dumps({"time": "yesterday", "reason": ev.CHECKPOINT_SAVED})),
    ("huge-time", json.dumps({"time": 1e300, "reason": ev.CHECKPOINT_SAVED})),
    ("year-99999", json.dumps({"time": 3e12, "reason": ev.CHECKPOINT_SAVED})),
    ("no-reason", json.dumps({"time": "2026-01-01T00:00:00Z"})),
    ("reason-list", json.dumps({"time": "2026-01-01T00:00:00Z", "reason": ["x"]})),
    ("node-object", json.dumps({"time": 1.7e9, "reason": ev.RUN_STARTED, "node": {"a": 1}})),
    ("data-list", json.dumps({"time": 1.7e9, "reason": ev.RUN_STARTED, "data": [1]})),
    ("not-an-object", "[1, 2, 3]"),
    ("a-number", "5"),
    ("garbage-mid-file", "{not json"),
]

READERS: dict[str, Callable[[Run], int]] = {
    "run_events": lambda run: len(run.run_events()),
    "events": lambda run: len([e for e in run.events(cluster=False) if e.run]),
    "timeline": lambda run: _timeline_markers(run),
    "session-events-table": lambda run: _events_table(run),
    "sidebar-run-json": lambda run: _sidebar_events(run),
    "trainer-resume": lambda run: _restart_count(run),
}


def _timeline_markers(run: Run) -> int:
    from tgnb.notebook.timeline import timeline

    tl = timeline(run)
    tl.to_svg()
    return sum(len(ln.markers) for ln in tl.lanes if ln.kind == "run")


def _events_table(run: Run) -> int:
    from tgnb.notebook.tables import events_text

    return events_text(run.run_events()).count("grpo-names")


def _sidebar_events(run: Run) -> int:
    from tgnb.server.serialize import run_json

    return len(run_json(run, detail=True)["events"])


def _restart_count(run: Run) -> int:
    """What the trainer reads from ``events.jsonl`` at a restart: 1 + the resumes recorded."""
    from tgnb.runs.policy import CheckpointPolicy
    from tgnb.train.preemption import CheckpointGuard

    assert run.run_dir is not None
    policy = CheckpointPolicy(on_signal=False, watch_drain=False)
    guard = CheckpointGuard(policy, run.run_dir, Recorder(run.run_dir, run=run.name))
    return guard.restart_count()


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("line", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_malformed_event_lines_are_skipped(
    reader: str,
    line: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in ("SLURM_RESTART_COUNT", "TGNB_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    resumed = json.dumps(
        {
            "time": datetime.now(timezone.utc).isoformat(),
            "source": "run",
            "reason": ev.RUN_RESUMED,
            "run": "grpo-names",
            "data": {"step": 1},
        }
    )
    run = _run(tmp_path, ev.CHECKPOINT_SAVED, "saved", "gpu-dp-1", [line[1], resumed])
    try:
        with caplog.at_level(logging.WARNING, logger="tgnb.events"):
            got = READERS[reader](run)
    except Exception as exc:
        record(False, server_error=True)
        raise AssertionError(f"{reader} raised {type(exc).__name__}: {exc}"[:300]) from None
    # the good events: RunStarted, the CheckpointSaved, the RunResumed after the bad line
    want = 2 if reader == "trainer-resume" else 3
    skipped = ev.read_jsonl(run.run_dir / "events.jsonl").skipped  # type: ignore[operator]
    ok = got == want and skipped == 1
    record(ok)
    assert ok, (got, want, skipped)
    assert any("malformed" in r.getMessage() for r in caplog.records)  # a note, not a crash
