"""The committed example notebooks and the `tgnb notebooks` command, without running a kernel."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tgnb import batch
from tgnb.errors import ValidationError

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("file", sorted(batch.NOTEBOOKS.values()))
def test_committed_notebook_is_clean_and_parameterized(file: str) -> None:
    nb = nbformat.read(NOTEBOOKS / file, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), (
        f"{file} is committed with outputs: clear them (Kernel > Restart and clear outputs)"
    )
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, f"{file} needs exactly one cell tagged 'parameters'"
    names = {line.split("=")[0].strip() for line in params[0].source.splitlines() if "=" in line}
    assert {"max_steps", "time_scale", "home"} <= names
    source = "\n".join(c.source for c in code)
    assert not re.search(r"TOGETHER_API_KEY\W*\s*=", source), f"{file} sets an API key"


def test_resolve_names_numbers_files_and_paths() -> None:
    quick = batch.resolve("quickstart")
    assert quick == NOTEBOOKS / "01-quickstart.ipynb"
    assert batch.resolve("01") == batch.resolve("01-quickstart") == quick
    assert batch.resolve(str(quick)) == quick
    assert batch.resolve("dpo").name == "03-dpo.ipynb"


def test_unknown_notebook_names_the_nearest() -> None:
    with pytest.raises(ValidationError, match="did you mean 'quickstart'"):
        batch.resolve("quikstart")


def test_cli_refuses_a_bad_name_before_running_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    rc = batch.main(["run", "quickstart", "nosuch", "--out", str(out), "--home", str(tmp_path)])
    assert rc == 2
    assert "no notebook 'nosuch'" in capsys.readouterr().err
    assert not out.exists()  # nothing ran, not even the valid first name
    assert not (tmp_path / "emulator").exists()


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert batch.main(["list"]) == 0
    text = capsys.readouterr().out
    for short, file in batch.NOTEBOOKS.items():
        assert short in text and str(NOTEBOOKS / file) in text


def test_notebooks_dir_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(batch.NOTEBOOKS_ENV, str(tmp_path))
    with pytest.raises(ValidationError, match=batch.NOTEBOOKS_ENV):
        batch.notebooks_dir()
