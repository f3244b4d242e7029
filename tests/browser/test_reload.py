"""Nothing lost when the page goes (issue 47 §4): in a real JupyterLab, in headless Chromium, a
``%tg watch`` panel of a running run is live again after a browser reload of the saved notebook
(the widget comes back from the kernel, not a frozen copy): its steps go on up to the run's end
with its curves, and ``%tg runs`` run after the reload still lists the run.

Real parts: JupyterLab and its kernel, the ipywidgets front end, Chromium (Debian's package)
driven by Playwright, the emulator daemon and the local engine running the stand-in trainer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.browser.test_quickstart_lab import _run_cells, _texts
from tests.conftest import wait_until

pytestmark = pytest.mark.slow

STANDIN_DIR = Path(__file__).resolve().parents[1] / "backends" / "local"
#: 0.7 s a step: the reload and the panel's return take about 6 s of the run here (probed), so
#: 40 steps (28 s) leave it running well past them; the test checks that it still was.
STEPS = 40
CELLS = ["%load_ext tgnb\n%tg attach --local", "%tg watch reloaded", "%tg runs"]


def _steps(cell: Any) -> list[int]:
    found = []
    for text in _texts(cell.locator(".widget-label")):
        m = re.match(r"step (\d+) / (\d+)", text)
        if m:
            found.append(int(m.group(1)))
    return found


@pytest.mark.timeout(900)
def test_a_watch_panel_is_live_again_after_a_reload(
    browser: Any, lab: Any, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.session import attach

    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    monkeypatch.setenv("STANDIN_STEP_SECONDS", "0.7")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
    session = attach(local=True, home=lab.home)
    assert session.scale(preemptible=8, wait=True, timeout=120, poll=0.2)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nbformat.write(nb, lab.root / "reload.ipynb")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    run = None
    selector = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell"
    try:
        page.goto(lab.open_url("reload.ipynb"))
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000
        )
        cells = page.locator(selector)
        wait_until(lambda: cells.count() == len(CELLS), 60, what="the notebook's cells")
        run = session.launch("grpo", name="reloaded", max_steps=STEPS)
        _run_cells(page, cells, 1, artifacts)
        wait_until(lambda: any(s > 0 for s in _steps(cells.nth(1))), 180, what="steps shown")
        before = max(_steps(cells.nth(1)))
        assert before < STEPS, "the run ended before the reload: nothing live to come back"
        page.keyboard.press("Control+s")  # as the autosave does
        wait_until(
            lambda: (
                "%tg watch" in (lab.root / "reload.ipynb").read_text()
                and "widget-view" in (lab.root / "reload.ipynb").read_text()
            ),
            60,
            what="the notebook saved with its widget output",
        )

        page.reload()
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000
        )
        cells = page.locator(selector)
        wait_until(lambda: cells.count() == len(CELLS), 60, what="the reloaded notebook's cells")
        wait_until(lambda: _steps(cells.nth(1)), 120, what="the panel back after the reload")
        cells.nth(1).scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "reload-1-back.png"))
        wait_until(
            lambda: max(_steps(cells.nth(1)), default=0) > before,
            180,
            what="the reloaded panel to go on (live, not a copy)",
        )
        assert not run.refresh().state.finished, "the run ended before the reloaded panel went on"
        assert run.wait(timeout=300, progress=False).state.value == "succeeded"
        wait_until(lambda: STEPS in _steps(cells.nth(1)), 120, what="the panel at the run's end")
        wait_until(
            lambda: "succeeded" in " ".join(_texts(cells.nth(1).locator(".widget-html"))),
            60,
            what="the reloaded panel to read the run's end",
        )
        assert cells.nth(1).locator(".widget-html svg polyline").count() >= 1
        page.screenshot(path=str(artifacts / "reload-2-ended.png"))

        cells.nth(2).locator(".jp-InputArea-prompt").click()  # %tg runs, after the reload
        page.keyboard.press("Shift+Enter")
        wait_until(
            lambda: "reloaded" in cells.nth(2).locator(".jp-OutputArea").inner_text(),
            120,
            what="%tg runs to list the run",
        )
    except BaseException:
        page.screenshot(path=str(artifacts / "reload-failed.png"), full_page=True)
        raise
    finally:
        page.close()
        if run is not None and not run.refresh().state.finished:
            run.stop()
