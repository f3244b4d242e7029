"""A function defined in a notebook cell runs on a node (issue 47 §1): the cell's ``__main__``
function, its closure and a global it uses travel by value through ``session.submit``, in a real
IPython shell against a real emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cell_function_runs_on_a_node(
    ip: Any, tg: Any, attached: EmulatorHandle, tmp_path: Path
) -> None:
    assert ip.run_line_magic("tg", "scale --preemptible 8 --wait --timeout 60s").reached
    (tmp_path / "nb").mkdir()
    ip.user_ns.update(session=tg.session, workdir=str(tmp_path / "nb"))
    cell = ip.run_cell(
        "SCALE = 3\n"
        "def make(offset):\n"
        "    def scaled(x):\n"
        "        import os\n"
        "        return x * SCALE + offset, os.environ['TGNB_RUN']\n"
        "    return scaled\n"
        "cell_run = session.executor(name='cell-fn', workdir=workdir).submit(make(1), 5)\n"
        "cell_value = cell_run.result(timeout=240)\n"
    )
    cell.raise_error()
    assert ip.user_ns["cell_value"] == (16, "cell-fn")
