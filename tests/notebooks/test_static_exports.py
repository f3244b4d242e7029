"""A notebook's static outputs hold what the panels showed when the work was done: after
``%tg scale --wait`` the ClusterPanel's ``text/html`` fallback reads the allocated capacity (not
"cluster: not read yet"); a panel shown while its run was going is sent again after each later
cell until the run ended, so ``%tg watch`` right after the launch shows the run's last step and
"succeeded", as ``%tg watch --wait`` does, in the executed notebook and in its HTML export.

A real kernel (papermill) and emulator daemon; the run is the local engine tests' stand-in trainer (a
step counter) instead of TRL, since the panels, not the training, are under test.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tgnb import batch
from tgnb.emulator.testing import running_emulator

STANDIN_DIR = Path(__file__).resolve().parents[1] / "backends" / "local"

CELLS = [
    "%load_ext tgnb\n%config Tg.poll_interval = 0.5\nsession = %tg attach --local",
    "%tg scale --preemptible 8 --wait --timeout 60s",
    "run = session.launch('grpo', name='static', max_steps=6)",
    "%tg watch static",
    "%tg watch static --wait --timeout 120s",
    "status = run.wait(timeout=120)\nstatus.state.value",
]


def _html_of(nb: Any, index: int) -> str:
    outs = nb.cells[index].outputs
    found = [o["data"]["text/html"] for o in outs if "text/html" in o.get("data", {})]
    assert found, outs
    return str(found[-1])


def test_panels_fallbacks_show_their_final_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TGNB_HOME", str(home))
    monkeypatch.delenv("TOGETHER_API_KEY", raising=False)
    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
    monkeypatch.setenv("STANDIN_STEP_SECONDS", "0.3")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    source = tmp_path / "panels.ipynb"
    nbformat.write(nb, source)
    with running_emulator(home, time_scale=0.01):
        result = batch.run_notebook(source, tmp_path / "out")
    done = nbformat.read(result.output, as_version=4)
    assert "succeeded" in str(done.cells[5].outputs)
    cluster = _html_of(done, 1)
    assert "not read yet" not in cluster
    assert "allocated 8 / desired 8 GPUs" in cluster
    # 6 steps of 0.3 s: still going as the watch cell ended; its panel was sent again after each
    # later cell until the run ended (`refresh_displays`), so the export shows the final state
    early = _html_of(done, 3)
    assert "tgnb-run-panel" in early and "succeeded" in early and "step 6 / 6" in early
    run = _html_of(done, 4)
    assert "step 6 / 6" in run and "succeeded" in run and "pending" not in run
    assert result.html is not None
    page = result.html.read_text(encoding="utf-8")
    assert "allocated 8 / desired 8 GPUs" in page and "step 6 / 6" in page
    assert "not read yet" not in page
    # run.wait()'s text bar: its redraws reduced to the last one, in one block
    bars = re.findall(r"run static: [^<]*", page)
    assert len(bars) == 1 and "6/6" in bars[0] and "succeeded" in bars[0], bars
