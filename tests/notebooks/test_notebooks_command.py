"""``tgnb notebooks run`` on small notebooks of the test's own, with a real kernel and real emulator
daemons: a one-line progress bar per notebook (cell i of N, elapsed), no kernel warning about
plain-text TCP (the kernel's sockets are CurveZMQ-encrypted), ``--stop`` stopping only an
emulator this command started, and a notebook asking another time scale than the running
emulator's failing with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from tgnb import batch
from tgnb.emulator import daemon


def notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "tgnb-home"
    monkeypatch.setenv("TGNB_HOME", str(home))
    monkeypatch.delenv("TOGETHER_API_KEY", raising=False)
    monkeypatch.delenv(daemon.OWNER_ENV, raising=False)
    return home


def test_run_shows_progress_and_stops_the_emulator_it_started(
    tmp_path: Path, home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    start = f"!{sys.executable} -m tgnb.cli emulator start --time-scale 0.5"
    nb = notebook(tmp_path / "starts.ipynb", "x = 1", start)
    try:
        rc = batch.main(["run", str(nb), "--out", str(tmp_path / "out"), "--no-html", "--stop"])
        out, err = capfd.readouterr()
        assert rc == 0, err
        assert "starts.ipynb: cell 2 of 2 [" in err
        assert "without encryption" not in err + out
        assert "stopped the local emulator" in out
        # the terminal ends with the result line, below --stop's
        assert out.rstrip().splitlines()[-1].startswith("starts.ipynb: ran in "), out
        assert not daemon.status(home).running
    finally:
        daemon.stop(home)


def test_stop_leaves_an_emulator_the_user_started(
    tmp_path: Path, home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    st, _ = daemon.start(home, daemon.ServeOptions.of(time_scale=0.5))
    try:
        nb = notebook(tmp_path / "reads.ipynb", "print('hello')")
        rc = batch.main(["run", str(nb), "--out", str(tmp_path / "out"), "--no-html", "--stop"])
        out, err = capfd.readouterr()
        assert rc == 0, err
        assert f"left the local emulator on {st.base_url} running" in out
        assert "tgnb emulator stop" in out
        assert daemon.status(home).pid == st.pid
        # a notebook that asks another time scale fails at once, saying why and what to do
        asks = notebook(
            tmp_path / "asks.ipynb", "%load_ext tgnb\n%tg attach --local --time-scale 0.02"
        )
        rc = batch.main(["run", str(asks), "--out", str(tmp_path / "out"), "--no-html"])
        out, err = capfd.readouterr()
        assert rc == 1
        assert "asks.ipynb failed in cell 1 (UsageError: %tg attach: the local emulator" in err
        assert "time scale 0.5 (asked 0.02)" in err and "tgnb emulator stop" in err
        assert daemon.status(home).pid == st.pid
    finally:
        daemon.stop(home)


def test_the_terminal_ends_with_what_the_notebooks_check_cell_printed(
    tmp_path: Path, home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The README's first command ends with the notebook's own verdict (the quickstart's
    ``OK: 30/30 steps, 1 restart(s), 0 step(s) lost``), not only where the notebook was written:
    what its cells tagged ``check`` printed, under the result line; other cells' output is not."""
    nb = notebook(tmp_path / "checks.ipynb", "print('not this one')", "print('OK: 3/3 steps')")
    data = nbformat.read(nb, as_version=4)
    data.cells[1].metadata["tags"] = ["check"]
    nbformat.write(data, nb)
    rc = batch.main(["run", str(nb), "--out", str(tmp_path / "out"), "--no-html"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    lines = out.rstrip().splitlines()
    assert lines[-2].startswith("checks.ipynb: ran in "), out
    assert lines[-1] == "  OK: 3/3 steps", out
    assert "not this one" not in out
