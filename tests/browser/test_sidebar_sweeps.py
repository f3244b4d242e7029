"""A sweep in the sidebar (issue 47 §2), in a real JupyterLab in headless Chromium: the Sweeps
section lists a `session.map` sweep with its runs by state; 'open' shows its table (a row per
run) over the chart of the runs' curves with a marker where the preemption hit them; 'stop' on
another sweep, confirmed in the dialog, stops its running runs.

Real parts: JupyterLab and the tgnb server extension, the labextension as installed, Chromium
(Debian's package) driven by Playwright, the emulator daemon and functions run on its local
engine (a Checkpointer loop, preempted once).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator import daemon
from tgnb.runs.spec import JobState

pytestmark = pytest.mark.slow

#: Seconds the page may take to show a change.
SEES = 120


def descend(steps: int) -> int:
    """A plain PyTorch loop through the Checkpointer, logging a falling loss: its steps."""
    import torch

    from tgnb.train import Checkpointer

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = Checkpointer(model, opt, max_steps=steps, dir="out")
    for step in ckpt.steps():
        time.sleep(0.1)
        model(torch.ones(4)).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.log(loss=1.0 / step)
    return steps


def _steps(run: Any) -> int:
    return max((int(r["step"]) for r in run.records("metrics")), default=0)


@pytest.mark.timeout(900)
def test_the_sidebar_shows_a_sweep_with_its_chart_and_stops_one(
    browser: Any, lab: Any, artifacts: Path
) -> None:
    from tgnb.session import attach

    session = attach(local=True, home=lab.home)
    assert session.scale(preemptible=8, wait=True, timeout=120, poll=0.2)
    wd = lab.root / "sweep-wd"
    wd.mkdir()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    curves = sleepers = None
    try:
        page.goto(f"{lab.url}/lab?token={lab.token}")
        tab = page.locator(".jp-SideBar .lm-TabBar-tab[data-id='tgnb-sidebar']")
        tab.wait_for(timeout=90_000)
        tab.click()
        ex = session.executor(name="curves", gpus_per_node=1, workdir=wd)
        curves = ex.map(descend, [60, 60])
        wait_until(lambda: all(_steps(r) >= 10 for r in curves), 300, what="10 steps each")
        session.preempt(curves[0].status.nodes[0])  # one node holds both: both preempted
        rows = curves.wait(timeout=600, poll=0.2)
        assert [r.state for r in rows] == ["succeeded", "succeeded"], rows
        assert all(r.preemptions == 1 for r in rows), rows

        item = page.locator("#tgnb-sidebar li[data-sweep='curves']")
        item.wait_for(timeout=SEES * 1000)
        wait_until(lambda: "2 succeeded" in item.inner_text(), SEES, what="both runs ended")
        assert "best curves-" in item.inner_text()
        page.screenshot(path=str(artifacts / "sweeps-1-sidebar.png"))
        item.locator("[data-testid=tgnb-sweep-open]").click()
        view = page.locator("[data-testid=tgnb-sweep-view][data-sweep='curves']")
        view.wait_for(timeout=SEES * 1000)
        table = view.locator("[data-testid=tgnb-sweep-table] tr[data-run]")
        wait_until(lambda: table.count() == 2, SEES, what="the sweep's table")
        cells = [str(t) for t in table.nth(0).locator("td").all_inner_texts()]
        assert cells[:5] == ["curves-0", "succeeded", "60/60", "0", "1"], cells
        assert cells[6] == "★ loss 0.01667 @ step 60", cells  # a loss: the smallest, the first
        assert "★" not in "".join(table.nth(1).locator("td").all_inner_texts())
        assert "every run has ended" in view.locator("[data-testid=tgnb-sweep-status]").inner_text()
        assert view.locator("[data-testid=tgnb-sweep-stop]").is_disabled()
        svg = session.sweep("curves").curves()
        assert [len(c.preemptions) for c in svg] == [1, 1]
        chart = view.locator("img.tgnb-sweep-chart")
        wait_until(lambda: chart.evaluate("i => i.complete && i.naturalWidth > 0"), SEES)
        page.screenshot(path=str(artifacts / "sweeps-2-table-and-chart.png"))

        sleepers = session.executor(name="sleepers", gpus_per_node=1, workdir=wd).map(
            time.sleep, [600, 600]
        )
        wait_until(lambda: all(r.status.nodes for r in sleepers), SEES, what="both placed")
        line = page.locator("#tgnb-sidebar li[data-sweep='sleepers']")
        line.wait_for(timeout=SEES * 1000)
        wait_until(lambda: "2 running" in line.inner_text(), SEES, what="the sleepers running")
        line.locator("[data-testid=tgnb-sweep-stop]").click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=30_000)
        assert "Stop the 2 unfinished run(s) of sweep sleepers?" in dialog.inner_text()
        page.screenshot(path=str(artifacts / "sweeps-3-stop-dialog.png"))
        dialog.locator("button.jp-mod-accept").click()
        rows = session.sweep("sleepers").wait(timeout=SEES, poll=0.5)
        assert [r.state for r in rows] == [JobState.CANCELLED.value] * 2
        wait_until(lambda: "2 cancelled" in line.inner_text(), SEES, what="the stop shown")
        assert line.locator("[data-testid=tgnb-sweep-stop]").is_disabled()
        page.screenshot(path=str(artifacts / "sweeps-4-stopped.png"))
    except BaseException:
        page.screenshot(path=str(artifacts / "sweeps-failed.png"), full_page=True)
        raise
    finally:
        page.close()
        for sweep in (curves, sleepers):
            if sweep is not None:
                sweep.stop()
        daemon.stop(lab.home)
