"""The sidebar's timeline tab as a researcher reads it, in a real JupyterLab in headless Chromium:
the window fitted to the run (the node it ran on was made long before the run, and its lane must
not squeeze the run into the right edge) and a signal, a checkpoint, the requeue and the resume
within a fraction of a second drawn as one marker with its count, every event named in its
tooltip. The checks read the SVG the page shows (the tab's ``<img>`` source, fetched through the
page). Real browser, real Lab, real emulator over loopback HTTP; the run uses the workload tests'
stand-in trainer instead of TRL, and the four close markers are written into the run's
``events.jsonl`` (a real preemption puts them seconds apart, not within one marker's width)."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tgnb import events as ev
from tgnb.events import Event

from .conftest import REPO, Lab

STANDIN_DIR = REPO / "tests" / "backends" / "local"
#: how long the node exists before the run starts (the run itself lasts a few seconds)
NODE_HEAD_START_S = 25.0

pytestmark = pytest.mark.slow

# The SVG the tab's <img> shows, parsed in the page: its width, the run lane's first and last
# markers (x), and every marker group with its count, its label and its tooltip.
READ_SVG = """async (run) => {
  const img = document.querySelector(`#tgnb-timeline-${run} img`);
  const text = await (await fetch(img.src)).text();
  const svg = new DOMParser().parseFromString(text, 'image/svg+xml').documentElement;
  const xs = [...svg.querySelectorAll('use.marker.RunStarted, use.marker.RunExited')]
    .map(u => parseFloat(u.getAttribute('x')));
  return {
    loaded: img.complete && img.naturalWidth > 0,
    width: parseFloat(svg.getAttribute('width')),
    xs: xs,
    groups: [...svg.querySelectorAll('g.marker-group')].map(g => ({
      count: parseInt(g.dataset.count || g.getAttribute('data-count')),
      label: g.querySelector('.marker-count').firstChild.textContent,
      tip: g.querySelector('title').textContent
    }))
  };
}"""


def _session(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tgnb.session import attach

    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    monkeypatch.setenv("STANDIN_STEP_SECONDS", "0.2")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
    return attach(local=True, home=lab.home)


def _add_close_markers(run: Any) -> list[str]:
    """A signal, a checkpoint, the requeue and the resume 50 ms apart, halfway through the run,
    appended to its events.jsonl as the runtime writes them; the reasons written."""
    path = Path(run.run_dir) / "events.jsonl"
    own = [Event.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line]
    start = min(e.time for e in own if e.reason == ev.RUN_STARTED)
    end = max(e.time for e in own if e.reason == ev.RUN_EXITED)
    node = next((e.node for e in own if e.node), None)
    reasons = [ev.SIGNAL_RECEIVED, ev.CHECKPOINT_SAVED, ev.RUN_REQUEUED, ev.RUN_RESUMED]
    mid = start + (end - start) / 2
    with open(path, "a", encoding="utf-8") as fh:
        for i, reason in enumerate(reasons):
            e = Event(
                time=mid + timedelta(seconds=0.05 * i),
                source="run",
                reason=reason,
                message="",
                node=node,
                run=run.name,
                data={"step": 5} if reason == ev.CHECKPOINT_SAVED else {},
            )
            fh.write(e.to_json() + "\n")
    return reasons


def test_timeline_tab_fits_the_run_and_groups_close_markers(
    lab: Lab, browser_page: Any, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = browser_page
    shot = lambda name: page.screenshot(path=str(artifacts / f"timeline-{name}.png"))  # noqa: E731
    session = _session(lab, monkeypatch)
    run: Any = None
    try:
        assert session.scale(8, wait=True, timeout=60).reached
        time.sleep(NODE_HEAD_START_S)  # the node is much older than the run
        run = session.launch("grpo", name="t-grouped", max_steps=20)
        run.wait(timeout=90, progress=False)
        _add_close_markers(run)
        # what the server's timeline route draws from, kept beside the screenshots
        drawn = "".join(e.to_json() + "\n" for e in run.events())
        (artifacts / "timeline-events.jsonl").write_text(drawn, encoding="utf-8")

        page.goto(f"{lab.url}lab?token={lab.token}")
        page.locator('.jp-SideBar [data-id="tgnb-sidebar"]').click()
        row = page.locator('#tgnb-sidebar .tgnb-run[data-run="t-grouped"]')
        row.wait_for()
        row.locator("button.tgnb-link", has_text="timeline").click()
        img = page.locator("#tgnb-timeline-t-grouped img")
        img.wait_for()
        page.wait_for_function(
            "() => { const i = document.querySelector('#tgnb-timeline-t-grouped img');"
            " return i && i.complete && i.naturalWidth > 0; }"
        )
        shot("01-tab")
        svg = page.evaluate(READ_SVG, "t-grouped")
        assert svg["loaded"], svg

        # fitted: the run's start and exit markers far apart across the drawing, the start not
        # pushed to the right edge by the older node's lane
        width, xs = svg["width"], svg["xs"]
        assert len(xs) == 2, svg
        first, last = min(xs), max(xs)
        assert (last - first) / width > 0.5, svg
        assert first < 0.5 * width, svg

        # grouped: the four close markers as one with its count and every event in its tooltip
        groups = [g for g in svg["groups"] if g["count"] >= 4]
        assert groups, svg
        group = groups[0]
        assert group["label"] == f"×{group['count']}", group
        for word in ("signal", "checkpoint", "requeued", "resumed"):
            assert word in group["tip"], group
    except Exception as exc:
        shot("failure")
        log = lab.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"{exc!r}\nJupyterLab log tail:\n{log}") from exc
    finally:
        if run is not None:
            run.stop()
            run.wait(timeout=60, progress=False)
