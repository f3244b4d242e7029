"""The quickstart in a real JupyterLab, in headless Chromium: run its attach, scale and launch cells
and watch the ClusterPanel and the RunPanel render and update.

Real parts: JupyterLab and its kernel, the ipywidgets front end, Chromium (Debian's package) driven
by Playwright, the emulator daemon and a GRPO run of the built-in tiny task. Screenshots of each
stage are kept (see `artifacts`).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01-quickstart.ipynb"
#: 0.05: each preemptible node takes 3 s to come, so the ClusterPanel shows 0, 8 then 16 GPUs.
PARAMETERS = {"time_scale": 0.05, "max_steps": 60}
LAST_CELL = "watch"  # run every cell up to this one: setup, emulator, attach, scale, launch, watch


def _copy_quickstart(lab: Any) -> list[str]:
    """Write the quickstart into the lab's root with the test's parameters injected after its
    parameters cell (as papermill does); the ids of its cells, in order."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = load_notebook_node(str(NOTEBOOK))
    nb = parameterize_notebook(nb, {**PARAMETERS, "home": str(lab.home)})
    nbformat.write(nb, lab.root / NOTEBOOK.name)
    return [c.id for c in nb.cells]


def _queued(cell: Any) -> bool:
    """Whether a code cell runs, ran or waits to run (its prompt shows [*] or a number)."""
    prompt = cell.locator(".jp-InputArea-prompt").inner_text()
    return bool(re.search(r"\[(\*|\d+)\]", prompt))


#: The JupyterLab dialogs a user answers (OK or Select) before the first code cell runs, neither
#: about tgnb: the kernel chooser (shown when the kernel list comes late) and the notice of a kernel
#: that died while starting (it restarts by itself). Any other dialog, or one of these once code
#: has run, fails the test with its text; each one seen is kept as a screenshot.
BEFORE_ANY_CODE = ("Select Kernel", "Kernel Restarting")


def _dialog(page: Any) -> tuple[str, str] | None:
    """The title and text of the dialog JupyterLab shows over the notebook, if any."""
    dialog = page.locator(".jp-Dialog")
    if not dialog.count():
        return None
    title = dialog.first.locator(".jp-Dialog-header").inner_text().strip()
    return title, " ".join(dialog.first.locator(".jp-Dialog-body").inner_text().split())


def _answer_dialog(page: Any, artifacts: Path, where: str, *, code_ran: bool) -> None:
    seen = _dialog(page)
    if seen is None:
        return
    title, body = seen
    page.screenshot(path=str(artifacts / f"dialog-{where}.png"))
    if title not in BEFORE_ANY_CODE or code_ran:
        pytest.fail(f"JupyterLab showed a dialog {where}: {title}: {body}", pytrace=False)
    with open(artifacts / "dialogs.txt", "a", encoding="utf-8") as log:
        log.write(f"{where}: {title}: {body}\n")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    page.locator(".jp-Dialog").wait_for(state="detached", timeout=30_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)


def _run_cells(page: Any, cells: Any, last: int, artifacts: Path) -> None:
    """Shift+Enter on cells 0..last, as a user would; each code cell is seen queued before the next
    key press (a press that comes before the kernel is connected is lost, so it is repeated). A
    dialog over the notebook is answered or reported (`BEFORE_ANY_CODE`)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    code_ran = False
    for i in range(last + 1):
        cell = cells.nth(i)
        code = "jp-CodeCell" in (cell.get_attribute("class") or "")
        for _attempt in range(5):
            _answer_dialog(page, artifacts, f"before cell {i}", code_ran=code_ran)
            try:  # select it, in command mode; a dialog that opens meanwhile blocks the click
                cell.locator(".jp-InputArea-prompt").click(timeout=10_000)
            except PlaywrightTimeout:
                continue
            page.keyboard.press("Shift+Enter")
            if not code:
                break
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not _queued(cell):
                time.sleep(0.1)
            if _queued(cell):
                code_ran = True
                break
        else:
            _answer_dialog(page, artifacts, f"at cell {i}", code_ran=True)
            pytest.fail(f"cell {i} did not start running after 5 Shift+Enter presses")


def _texts(locator: Any) -> list[str]:
    return [t.strip() for t in locator.all_inner_texts()]


def test_quickstart_panels_render_and_update(browser: Any, lab: Any, artifacts: Path) -> None:
    ids = _copy_quickstart(lab)
    last = ids.index(LAST_CELL)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(lab.open_url(NOTEBOOK.name))
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000
        )
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        wait_until(lambda: cells.count() == len(ids), 60, what="every cell of the notebook")
        page.screenshot(path=str(artifacts / "01-opened.png"))

        _run_cells(page, cells, last, artifacts)

        # -- ClusterPanel: allocated against desired while the preemptible nodes come ----------
        scale = cells.nth(ids.index("scale"))
        label = scale.locator(".widget-label")
        seen: list[str] = []

        def reached() -> bool:
            for text in _texts(label):
                if text.startswith("allocated ") and (not seen or seen[-1] != text):
                    seen.append(text)
            return bool(seen) and seen[-1] == "allocated 16 / desired 16 GPUs"

        wait_until(reached, 180, what="the ClusterPanel to show 16 of 16 GPUs", every=0.05)
        scale.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "02-cluster-panel.png"))
        allocated = [int(m.group(1)) for s in seen if (m := re.match(r"allocated (\d+) /", s))]
        assert len(set(allocated)) >= 2 and allocated[0] < 16, seen  # it moved while we looked
        assert allocated == sorted(allocated), seen
        assert scale.locator(".widget-hprogress").count() == 1
        assert scale.locator(".widget-slider").count() == 1  # the target control, steps of 8
        assert "Scale" in _texts(scale.locator(".widget-button"))
        nodes = _texts(scale.locator("table.tgnb-nodes tbody tr"))
        assert sum("preemptible" in row for row in nodes) == 2, nodes

        # -- RunPanel: steps going up while the run trains -------------------------------------
        watch = cells.nth(ids.index("watch"))
        run_label = watch.locator(".widget-label")
        steps: list[int] = []

        def progressed() -> bool:
            for text in _texts(run_label):
                m = re.match(r"step (\d+) / (\d+)", text)
                if m and (not steps or steps[-1] != int(m.group(1))):
                    assert int(m.group(2)) == PARAMETERS["max_steps"]
                    steps.append(int(m.group(1)))
            return len([s for s in steps if s > 0]) >= 2

        wait_until(progressed, 300, what="the RunPanel to show the run's steps going up", every=0.2)
        watch.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "03-run-panel.png"))
        assert steps == sorted(steps) and steps[-1] > steps[0], steps
        header = " ".join(_texts(watch.locator(".widget-html")))
        assert "running" in header
        assert watch.locator(".widget-html svg").count() >= 2  # reward and loss curves
        assert watch.locator(".widget-html svg polyline, .widget-html svg path").count() >= 1
    except BaseException:
        page.screenshot(path=str(artifacts / "failed.png"), full_page=True)
        (artifacts / "failed.html").write_text(page.content(), encoding="utf-8")
        raise
    finally:
        page.close()
    shutil.copy(lab.log, artifacts / "jupyterlab.log")
