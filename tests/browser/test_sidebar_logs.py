"""The sidebar's live log (issue 47 §3) in a real JupyterLab, in headless Chromium: a run's 'logs'
button opens the view `run.logs(follow=True)` prints in a cell, followed while the run runs: each
attempt after a header with its node, start and how the one before ended, every line of the
program once, and the run's end.

Real parts: JupyterLab and the tgnb server extension, the labextension as installed, Chromium
(Debian's package) driven by Playwright, the emulator daemon and a script run on its local engine,
preempted once.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator import daemon
from tgnb.events import JOB_PLACED
from tgnb.runs.spec import JobState

pytestmark = pytest.mark.slow

#: Seconds the page may take to show a change.
SEES = 120

#: A program that resumes near its end: its first attempt is long enough for the page to follow it
#: before the preemption; its next attempt prints only the last `argv[2]` steps (fewer seconds).
PLAIN = """\
    import os, sys, time

    steps = int(sys.argv[1])
    restarted = int(os.environ.get("TGNB_RESTART_COUNT") or 0) > 0
    first = steps - int(sys.argv[2]) + 1 if restarted else 1
    for step in range(first, steps + 1):
        time.sleep(0.1)
        print(f"step {step}", flush=True)
    print("done", flush=True)
"""


def _rows(page: Any, kind: str) -> list[str]:
    return [
        str(t) for t in page.locator(f"[data-testid=tgnb-log] .tgnb-log-{kind}").all_inner_texts()
    ]


@pytest.mark.timeout(900)
def test_the_sidebar_opens_a_runs_live_log(browser: Any, lab: Any, artifacts: Path) -> None:
    from tgnb.session import attach

    session = attach(local=True, home=lab.home)
    assert session.scale(preemptible=8, wait=True, timeout=120, poll=0.2)
    wd = lab.root / "logged-wd"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(PLAIN))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    run = None
    try:
        page.goto(f"{lab.url}/lab?token={lab.token}")
        tab = page.locator(".jp-SideBar .lm-TabBar-tab[data-id='tgnb-sidebar']")
        tab.wait_for(timeout=90_000)
        tab.click()
        run = session.launch("train.py", args=["300", "30"], workdir=wd, name="logged")
        button = page.locator("#tgnb-sidebar li[data-run='logged'] [data-testid=tgnb-run-logs]")
        button.wait_for(timeout=SEES * 1000)
        wait_until(lambda: len(run.logs()) >= 5, SEES, what="the run's first lines")
        button.click()  # while the run runs: the view follows it
        wait_until(lambda: len(_rows(page, "output")) >= 5, SEES, what="the view's first lines")
        assert _rows(page, "end") == []  # not ended yet: following
        page.screenshot(path=str(artifacts / "logs-1-following.png"))

        def preempt_once() -> None:
            wait_until(lambda: len(run.logs()) >= 20 and run.status.nodes, timeout=240)
            session.preempt(run.status.nodes[0])

        helper = threading.Thread(target=preempt_once, daemon=True)
        helper.start()
        helper.join(timeout=300)
        assert run.wait(timeout=600).state is JobState.SUCCEEDED, run.status
        wait_until(lambda: _rows(page, "end"), SEES, what="the view to show the run's end")
        page.screenshot(path=str(artifacts / "logs-2-ended.png"))

        placed = [e for e in run.run_events() if e.reason == JOB_PLACED]
        assert [e.data["restart_count"] for e in placed] == [0, 1], placed
        heads = _rows(page, "attempt")
        assert len(heads) == 2, heads
        assert heads[0].startswith(f"── attempt 1 on {placed[0].node}, started "), heads[0]
        assert heads[1].startswith("── attempt 2 on "), heads[1]
        assert heads[1].endswith("; attempt 1: preempted ──"), heads[1]
        assert _rows(page, "output") == run.logs()  # every line of both attempts, once
        assert _rows(page, "end") == [f"── {run.closing_line()} ──"]
        second = page.locator("[data-testid=tgnb-log] .tgnb-log-attempt").nth(1)
        second.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "logs-3-second-attempt.png"))
        status = page.locator("[data-testid=tgnb-log-status]").inner_text()
        assert status == "the run has ended"
        # the same button again shows the open view, not a second one
        button.click()
        assert page.locator("[data-testid=tgnb-log]").count() == 1
    except BaseException:
        page.screenshot(path=str(artifacts / "logs-failed.png"), full_page=True)
        raise
    finally:
        page.close()
        if run is not None and not run.refresh().state.finished:
            run.stop()
        daemon.stop(lab.home)
