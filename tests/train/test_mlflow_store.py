"""MLflow's file store (``MLFLOW_TRACKING_URI=file:...`` or a plain path), which MLflow 3 refuses
to open: a launch that would report to it is refused in one line naming the fix (an sqlite URI),
nothing recorded; a node that meets it anyway (a script's own ``report_to``) fails in one line as a
bad config, final, instead of a traceback restarted at every start. Real MLflow on the node side."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.errors import TrainConfigError, ValidationError
from tgnb.prelaunch import check_mlflow_store, plan
from tgnb.runs.trainconfig import from_dict
from tgnb.train.record import Recorder
from tgnb.train.tracker import open_trackers


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


def test_a_script_whose_env_names_a_file_store_is_refused_at_launch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(ValidationError) as err:
        plan("train.py", workdir=tmp_path, env={"MLFLOW_TRACKING_URI": f"file:{tmp_path}/mlruns"})
    assert f"sqlite:///{tmp_path}/mlruns/mlflow.db" in _one_line(err)
    ok = plan("train.py", workdir=tmp_path, env={"MLFLOW_TRACKING_URI": "sqlite:///m.db"})
    ok.discard()


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "./mlruns", "/tmp/mlruns"])
def test_a_builtin_run_reporting_to_mlflow_with_a_file_store_is_refused(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = from_dict({"algorithm": "grpo", "trl": {"report_to": ["mlflow"]}})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the node inherits the notebook's
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ValidationError) as err:
        check_mlflow_store(cfg, {})
    assert "MLflow's file store" in _one_line(err) and "sqlite:///" in str(err.value)
    check_mlflow_store(cfg, {"MLFLOW_ALLOW_FILE_STORE": "true"})  # MLflow's own opt-out
    check_mlflow_store(cfg, {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"})
    check_mlflow_store(from_dict({"algorithm": "grpo"}), {})  # reports to no MLflow


def test_a_node_meeting_a_file_store_fails_as_a_bad_config_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path}/mlruns")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    with pytest.raises(TrainConfigError) as err:
        open_trackers(Recorder(tmp_path / "run", "r"), "mlflow", metrics=True)
    assert "sqlite:" in _one_line(err)
