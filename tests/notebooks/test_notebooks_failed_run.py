"""``tgnb notebooks run A B``, a sweep, with a real kernel and a real emulator daemon: when one
notebook's Post-Training run fails (its Model Resource goes to ``MODEL_RESOURCES_STATUS_ERROR``:
a model that cannot load), the others still run and the command exits non-zero, naming the
failed notebook and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb import batch
from tgnb.emulator.testing import EmulatorHandle, unloadable_model

from .test_notebooks_command import notebook


def test_a_sweep_whose_run_fails_exits_non_zero(
    emulator: EmulatorHandle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    for name, value in emulator.env.items():  # the kernels inherit where the emulator answers
        monkeypatch.setenv(name, value)
    broken = unloadable_model(tmp_path)
    failing = notebook(
        tmp_path / "run-a.ipynb",
        "from together.post_training import ModelResourcesClient",
        f"mr = ModelResourcesClient.create(base_model={broken!r}, interval=0.1)",
    )
    fine = notebook(tmp_path / "run-b.ipynb", "print('run b done')")
    out = tmp_path / "out"
    rc = batch.main(["run", str(failing), str(fine), "--out", str(out), "--no-html"])
    _, err = capfd.readouterr()
    assert rc == 1, err
    assert "run-a.ipynb failed in cell 2 (RuntimeError" in err
    assert (out / "run-b.ipynb").is_file()  # the rest of the sweep still ran
    assert "run b done" in (out / "run-b.ipynb").read_text(encoding="utf-8")
