"""``tgnb notebooks run A B --sweep NAME`` (issue 47 §2), with real kernels and a real emulator
daemon: every run the notebooks' kernels launch is recorded in sweep NAME of the run store, which
a session opens afterwards as one object; a bad name is refused before any kernel starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tgnb import batch
from tgnb.emulator.testing import EmulatorHandle
from tgnb.session import SWEEP_ENV, attach

from .test_notebooks_command import notebook

SETUP = "import tgnb\nsession = tgnb.attach(local=True)"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_notebooks_run_as_one_sweep(
    emulator: EmulatorHandle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    for name, value in emulator.env.items():  # the kernels inherit where the emulator answers
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TGNB_HOME", str(emulator.home))
    monkeypatch.delenv(SWEEP_ENV, raising=False)
    session = attach(local=True, home=emulator.home)
    assert session.scale(preemptible=8, wait=True, timeout=120, poll=0.2)
    folder = tmp_path / "nbs"  # the notebooks' folder: their runs' workdir
    folder.mkdir()
    one = notebook(
        folder / "seed-1.ipynb", SETUP, "print(session.submit(abs, -3).result(timeout=300))"
    )
    two = notebook(
        folder / "seed-2.ipynb", SETUP, "print(session.submit(abs, -4).result(timeout=300))"
    )
    out = tmp_path / "out"

    rc = batch.main(["run", str(one), str(two), "--out", str(out), "--no-html", "--sweep", "x Y"])
    _, err = capfd.readouterr()
    assert rc == 2 and "sweep name 'x Y' is not valid" in err, err
    assert not out.exists() and session.runs() == []  # nothing ran

    rc = batch.main(["run", str(one), str(two), "--out", str(out), "--no-html", "--sweep", "seeds"])
    _, err = capfd.readouterr()
    assert rc == 0, err
    assert SWEEP_ENV not in os.environ  # set for the kernels only
    sweep = session.sweep("seeds")
    assert sweep.record.source == "notebooks" and len(sweep) == 2
    assert sweep.results() == [3, 4]
    assert [r.run for r in sweep.rows()] == [r.name for r in session.runs()]
