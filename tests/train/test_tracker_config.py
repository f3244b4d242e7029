"""`tgnb.train.tracker` without a training run: which trackers ``report_to`` names, the one-line
error when a named tracker is not installed (its absence faked by hiding the module: both are
installed here), and a tracker left out when ``report_to`` names none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tgnb.errors import TrainConfigError
from tgnb.train.record import Recorder
from tgnb.train.tracker import STATE, open_trackers, trackers_in


@pytest.mark.parametrize(
    ("report_to", "want"),
    [
        (None, []),
        ("none", []),
        ([], []),
        ("wandb", ["wandb"]),
        (["tensorboard", "mlflow"], ["mlflow"]),
        (["MLflow", "wandb"], ["wandb", "mlflow"]),
        ("all", ["wandb", "mlflow"]),  # both installed here
    ],
)
def test_trackers_named_by_report_to(report_to: object, want: list[str]) -> None:
    assert trackers_in(report_to) == want  # type: ignore[arg-type]


def test_a_tracker_not_installed_is_one_line_naming_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    recorder = Recorder(tmp_path / "run", "r")
    with pytest.raises(TrainConfigError, match=r"pip install 'tgnb\[tracking\]'") as err:
        open_trackers(recorder, ["wandb"], metrics=True)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / STATE).exists() and recorder.listeners == []


def test_no_tracker_named_opens_nothing(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "run", "r")
    assert open_trackers(recorder, ["tensorboard"], metrics=True) == []
    assert not (tmp_path / "run" / STATE).exists() and recorder.listeners == []
