"""`tgnb.prelaunch.plan`: the workdir is snapshotted once, the launch checks read that snapshot
(what the node gets, not the live folder), and a failure leaves nothing behind. No cluster is
needed: the plan is built without one (no estimate), as `Session.launch` builds it before it
records anything."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tgnb import prelaunch
from tgnb.errors import TgnbError, ValidationError
from tgnb.runs import workdir as wd
from tgnb.runs.spec import Resources

SCRIPT = "import helper\nprint(helper.VALUE)\n"


@pytest.fixture
def staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where staged snapshots go in this test (so a leftover one can be seen)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT, encoding="utf-8")
    (folder / "helper.py").write_text("VALUE = 1\n", encoding="utf-8")
    return folder


def _plan(folder: Path, what: str = "train.py", **kw: object) -> prelaunch.LaunchPlan:
    return prelaunch.plan(what, workdir=folder, name="plan-run", resources=Resources(), **kw)


def test_the_plan_ships_a_staged_snapshot_that_edits_do_not_reach(
    tmp_path: Path, staging: Path
) -> None:
    folder = _project(tmp_path)
    plan = _plan(folder)
    snap = plan.snapshot
    assert snap is not None and plan.spec.snapshot is snap and plan.estimate is None
    assert snap.folder == folder.resolve() and snap.root.parent == staging
    assert sorted(snap.files) == ["helper.py", "train.py"]
    (folder / "helper.py").write_text("VALUE = 2\n", encoding="utf-8")  # edited after launch
    (folder / "train.py").unlink()
    assert (snap.root / "helper.py").read_text(encoding="utf-8") == "VALUE = 1\n"
    assert plan.spec.workdir_snapshot() is snap  # the engines ship this one, no second scan
    plan.discard()
    assert list(staging.iterdir()) == []


def test_a_script_left_out_by_the_ignore_file_is_refused(tmp_path: Path, staging: Path) -> None:
    folder = _project(tmp_path)
    (folder / wd.IGNORE_FILE).write_text("*.py\n", encoding="utf-8")
    with pytest.raises(ValidationError, match=r"left out of the snapshot .*\.tgnbignore"):
        _plan(folder)
    assert list(staging.iterdir()) == []  # nothing staged is left behind


def test_a_dataset_in_an_ignored_folder_is_refused_at_launch(tmp_path: Path, staging: Path) -> None:
    """The README advises ignoring data/: a run that reads its dataset from there would fail on
    the node, so the launch, which reads the snapshot, refuses it."""
    folder = _project(tmp_path)
    (folder / "data").mkdir()
    (folder / "data" / "sft.jsonl").write_text('{"prompt": "1+1=", "completion": "2"}\n')
    (folder / wd.IGNORE_FILE).write_text("data/\n", encoding="utf-8")
    config = {"algorithm": "sft", "model": "tiny", "dataset": "data/sft.jsonl", "max_steps": 2}
    with pytest.raises(TgnbError, match=r"data/sft\.jsonl"):
        prelaunch.plan(config, workdir=folder, name="plan-data", resources=Resources())
    assert list(staging.iterdir()) == []


def test_a_file_swapped_for_a_link_while_the_snapshot_is_taken_is_refused(
    tmp_path: Path, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's folder changes between the listing and the copy (a real file replaced by a link
    to a file outside it): the copy does not follow it, and nothing is staged."""
    folder = _project(tmp_path)
    secret = tmp_path / "outside.txt"
    secret.write_text("not for the node\n", encoding="utf-8")
    real_scan = wd.scan

    def scan_then_swap(root: str | os.PathLike[str], *a: int, **kw: bool) -> wd.Snapshot:
        listed = real_scan(root, *a, **kw)
        (folder / "helper.py").unlink()
        (folder / "helper.py").symlink_to(secret)
        return listed

    monkeypatch.setattr(wd, "scan", scan_then_swap)
    with pytest.raises(ValidationError, match=r"holds a link 'helper\.py'"):
        wd.take(folder)
    assert list(staging.iterdir()) == []


def test_a_file_deleted_while_the_snapshot_is_taken_names_the_fix(
    tmp_path: Path, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _project(tmp_path)
    real_scan = wd.scan

    def scan_then_delete(root: str | os.PathLike[str], *a: int, **kw: bool) -> wd.Snapshot:
        listed = real_scan(root, *a, **kw)
        (folder / "helper.py").unlink()
        return listed

    monkeypatch.setattr(wd, "scan", scan_then_delete)
    with pytest.raises(ValidationError, match="disappeared while the snapshot was taken"):
        _plan(folder)
    assert list(staging.iterdir()) == []
