"""A notebook's HTML export read as a newcomer would, in headless Chromium, checked by the DOM: no
stderr output area (progress bars are not errors), the panels' static fallbacks each with its
final state, and no word broken inside a table cell at a laptop's width.

Real parts: a papermill kernel, the emulator daemon, nbconvert's lab template, Chromium. The run
is the local engine tests' stand-in trainer (a step counter) instead of TRL: the export is under test,
not the training (the six example notebooks' exports take minutes each; this takes seconds).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tgnb import batch
from tgnb.emulator.testing import running_emulator

#: The module's export comes from a notebook that launches runs (the stand-in trainer).
pytestmark = pytest.mark.training

STANDIN_DIR = Path(__file__).resolve().parents[1] / "backends" / "local"

CELLS = [
    "%load_ext tgnb\n%config Tg.poll_interval = 0.5\nsession = %tg attach --local",
    "%tg scale --preemptible 8 --wait --timeout 60s",
    "run = session.launch('grpo', name='export-dom', max_steps=6)",
    "%tg watch export-dom",
    "from tgnb.notebook.widgets import RunPanel\n\nRunPanel(run, poll_interval=0.5)  # the value",
    "print(run.name, run.wait(timeout=120).state.value)",
    "%tg watch export-dom --wait",
    "%tg preempt",
    "%tg events --since 1h",
    "%tg runs --all",
    "%tg cost --all",
]

#: A notebook that never loads the magics: a panel displayed in a cell that lasts until the run
#: ends is brought up to date as that cell ends too.
PLAIN_CELLS = [
    "import tgnb\n\nsession = tgnb.attach(local=True)",
    "run = session.launch('grpo', name='plain', max_steps=5)",
    "from tgnb.notebook.widgets import RunPanel\n\n"
    "display(RunPanel(run, poll_interval=0.5))\n"
    "run.wait(timeout=120, progress=False).state.value",
]

#: Words of a table cell laid out on more than one line (a word cut at the cell's edge).
BROKEN_WORDS_JS = """
() => {
  const broken = [];
  for (const cell of document.querySelectorAll('.jp-OutputArea-output td, .jp-OutputArea-output th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
      const re = /\\S+/g;
      let m;
      while ((m = re.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set(
          [...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}
"""


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("export-dom")
    home = tmp / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TGNB_HOME", str(home))
        mp.delenv("TOGETHER_API_KEY", raising=False)
        mp.setenv("TGNB_TRAIN_MODULE", "standin_train")
        path = os.environ.get("PYTHONPATH")
        mp.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
        mp.setenv("STANDIN_STEP_SECONDS", "0.3")
        sources = []
        for name, cells in (("export-dom", CELLS), ("no-magics", PLAIN_CELLS)):
            nb = nbformat.v4.new_notebook()
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
            nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
            sources.append(tmp / f"{name}.ipynb")
            nbformat.write(nb, sources[-1])
        with running_emulator(home, time_scale=0.01):
            results = [batch.run_notebook(source, tmp / "out") for source in sources]
    assert results[0].html is not None and results[1].html is not None
    return results[0].html


@pytest.fixture
def plain_page(browser: Any, export: Path) -> Any:
    context = browser.new_context(viewport={"width": 900, "height": 1000})
    page = context.new_page()
    page.goto(export.with_name("no-magics.html").as_uri(), wait_until="domcontentloaded")
    yield page
    context.close()


@pytest.fixture
def page(browser: Any, export: Path) -> Any:
    context = browser.new_context(viewport={"width": 900, "height": 1000})
    page = context.new_page()
    page.goto(export.as_uri(), wait_until="domcontentloaded")
    yield page
    context.close()


def test_no_stderr_block_in_the_export(page: Any) -> None:
    stderr = page.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    assert stderr.count() == 0, stderr.all_inner_texts()
    # the progress bar is there, as ordinary output, at its last state
    stdout = "\n".join(
        page.locator('.jp-RenderedText[data-mime-type="text/plain"]').all_inner_texts()
    )
    assert "run export-dom: 100%" in stdout and "6/6" in stdout, stdout


def test_panels_show_their_final_state(page: Any) -> None:
    """`%tg watch`'s panel and a panel that is a cell's value, both shown before the run ended,
    read the run's end, as `%tg watch --wait`'s does: the last step, the state, both charts (the
    export's panel was frozen at its first step with empty charts); the text fallback too."""
    texts = page.locator(".tgnb-run-panel").all_inner_texts()
    assert len(texts) == 3, texts
    for text in texts:
        assert "step 6 / 6" in text and "succeeded" in text, text
    curves = [
        page.locator(".tgnb-run-panel").nth(i).locator("svg polyline").count() for i in (0, 1, 2)
    ]
    assert curves[2] >= 1 and curves == [curves[2]] * 3, curves  # the charts drawn, as at the end
    assert page.locator(".tgnb-events table tbody tr").count() >= 3


def test_the_executed_notebooks_panel_text_is_the_final_state(export: Path) -> None:
    """The executed notebook itself (not only its HTML): the ``%tg watch`` cell's display holds
    the run's end in ``text/plain`` too, the panel's words (it was ``RunPanel(...)``)."""
    nb = nbformat.read(export.with_suffix(".ipynb"), as_version=4)
    watch = next(c for c in nb.cells if c.source == "%tg watch export-dom")
    shown = [o for o in watch.outputs if o.get("output_type") == "display_data"]
    assert len(shown) == 1, watch.outputs
    text = shown[0]["data"]["text/plain"]
    assert "step 6 / 6" in text and "succeeded" in text and "RunPanel(" not in text, text


def test_no_word_broken_in_a_table_cell(page: Any) -> None:
    assert page.locator(".jp-OutputArea-output td").count() > 10
    assert page.evaluate(BROKEN_WORDS_JS) == []


def test_the_broken_word_check_can_fail(page: Any) -> None:
    """The check above finds a word cut by JupyterLab's text styles (what the events read as
    before: a text block in `word-break: break-all`)."""
    page.evaluate(
        """() => {
          const cell = document.querySelector('.tgnb-events td');
          cell.style.wordBreak = 'break-all';
          cell.style.whiteSpace = 'normal';
          cell.style.display = 'block';
          cell.style.width = '30px';
        }"""
    )
    assert page.evaluate(BROKEN_WORDS_JS) != []


def test_a_panel_without_the_magics_shows_its_last_state(plain_page: Any) -> None:
    panels = plain_page.locator(".tgnb-run-panel")
    assert panels.count() == 1
    text = panels.inner_text()
    assert "step 5 / 5" in text and "succeeded" in text, text
