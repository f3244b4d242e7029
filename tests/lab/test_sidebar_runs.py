"""The sidebar's runs and toasts as a researcher reads them, in a real JupyterLab in headless
Chromium: the running run on top of finished ones, newer before older, a filter; a preemption
toast shown once, not again after a page reload; event labels whole at the sidebar's width; each
run's dollars and the cluster's prices per GPU-hour.
Real browser, real Lab, real emulator over loopback HTTP; the runs use the workload tests'
stand-in trainer instead of TRL."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until

from .conftest import REPO, Lab

STANDIN_DIR = REPO / "tests" / "backends" / "local"
#: A raw ISO 8601 timestamp, which no toast or feed line should show.
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")

pytestmark = pytest.mark.slow


def _session(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tgnb.session import attach

    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    monkeypatch.setenv("STANDIN_STEP_SECONDS", "0.2")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
    return attach(local=True, home=lab.home)


def _names(sidebar: Any) -> list[str]:
    return [x for x in sidebar.locator(".tgnb-run").evaluate_all("l => l.map(e => e.dataset.run)")]


def test_runs_order_filter_and_toast_once(
    lab: Lab, browser_page: Any, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = browser_page
    shot = lambda name: page.screenshot(path=str(artifacts / f"runs-{name}.png"))  # noqa: E731
    session = _session(lab, monkeypatch)
    runs: list[Any] = []
    try:
        assert session.scale(24, wait=True, timeout=60).reached
        # the oldest run is the one still running; two newer ones finish
        runs.append(session.launch("grpo", name="a-long-running", max_steps=3000, budget_usd=1000))
        time.sleep(1.1)
        for name in ("b-done-older", "c-done-newer"):
            runs.append(session.launch("grpo", name=name, max_steps=2))
            runs[-1].wait(timeout=90, progress=False)
            time.sleep(1.1)
        wait_until(lambda: runs[0].status.nodes, timeout=60)

        page.goto(f"{lab.url}lab?token={lab.token}")
        page.locator('.jp-SideBar [data-id="tgnb-sidebar"]').click()
        sidebar = page.locator("#tgnb-sidebar")
        sidebar.locator('.tgnb-run[data-run="c-done-newer"]').wait_for()
        assert _names(sidebar) == ["a-long-running", "c-done-newer", "b-done-older"]
        info = sidebar.locator('.tgnb-run[data-run="c-done-newer"] .tgnb-muted').inner_text()
        assert "$" in info and " spent" in info, info  # its dollars so far (tgnb.prices)
        running = sidebar.locator('.tgnb-run[data-run="a-long-running"] .tgnb-muted').inner_text()
        assert "of $1,000.00 budget" in running, running  # the run with a budget: against it
        rates = sidebar.locator(".tgnb-prices").inner_text()
        assert "/GPU-h standard" in rates and "/GPU-h preemptible" in rates, rates

        box = sidebar.locator('[data-testid="tgnb-runs-filter"]')
        box.fill("done newer")
        assert _names(sidebar) == ["c-done-newer"]
        box.fill("running")
        assert _names(sidebar) == ["a-long-running"]
        box.fill("nosuchrun")
        assert "no runs match" in sidebar.locator(".tgnb-runs").inner_text()
        box.fill("")
        shot("01-ordered")

        # a preemption notice: one toast; after a reload, none for the same notice
        node = runs[0].status.nodes[0]
        lab.emulator.preempt(session.cluster.id, node)
        toast = page.locator(".Toastify__toast", has_text="Preemption notice")
        toast.first.wait_for(timeout=30_000)
        assert toast.count() == 1
        # times as the sidebar shows them (local, 24-hour), no raw ISO timestamp
        said = toast.first.inner_text()
        assert not ISO.search(said), said
        assert re.search(r"^\d\d:\d\d:\d\d Preemption notice: .*ends at \d\d:\d\d:\d\d", said), said
        sidebar.locator(".tgnb-reason-TogetherPreemptionNotified").first.wait_for()
        # every label whole: no text cut off at the sidebar's edge
        cut = sidebar.locator(".tgnb-event span").evaluate_all(
            "l => l.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"
        )
        assert cut == [], cut
        shot("02-toast")
        seen = page.evaluate("() => window.localStorage.getItem('tgnb:toasted')")
        assert seen and node in seen

        page.reload()
        page.locator('.jp-SideBar [data-id="tgnb-sidebar"]').click()
        sidebar.locator(".tgnb-reason-TogetherPreemptionNotified").first.wait_for(timeout=30_000)
        page.wait_for_timeout(4000)  # several of the server's polls (0.5 s)
        again = page.locator(".Toastify__toast", has_text="Preemption notice")
        assert again.count() == 0, again.all_inner_texts()
        shot("03-reloaded")
        feed = sidebar.locator(".tgnb-reason-TogetherPreemptionNotified").first.inner_text()
        assert not ISO.search(feed), feed

        # a page whose toasts were never shown (another browser) opened two minutes after the
        # notice: the notice is in the feed, not toasted (it was, with every stale notice at once)
        page.evaluate("() => window.localStorage.removeItem('tgnb:toasted')")
        page.add_init_script("{ const now = Date.now; Date.now = () => now() + 120000; }")
        page.reload()
        page.locator('.jp-SideBar [data-id="tgnb-sidebar"]').click()
        sidebar.locator(".tgnb-reason-TogetherPreemptionNotified").first.wait_for(timeout=30_000)
        page.wait_for_timeout(4000)
        stale = page.locator(".Toastify__toast", has_text="Preemption notice")
        assert stale.count() == 0, stale.all_inner_texts()
        shot("04-stale-not-toasted")
    except Exception:
        shot("failure")
        log = lab.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"browser test failed; JupyterLab log tail:\n{log}") from None
    finally:
        for run in runs:
            run.stop()
            run.wait(timeout=60, progress=False)
