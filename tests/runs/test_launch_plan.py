"""`tgnb.prelaunch.plan`: the workdir is snapshotted once, the launch checks read that snapshot
(what the node gets, not the live folder), and a failure leaves nothing behind. No cluster is
needed: the plan is built without one (no estimate), as `Session.launch` builds it before it
records anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tgnb import prelaunch
from tgnb.errors import TgnbError, ValidationError
from tgnb.runs import node
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


def test_tgnbs_own_home_inside_the_folder_is_left_out_and_said(
    tmp_path: Path, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who keeps TGNB_HOME inside the project folder (as a demo folder does): the
    snapshot leaves the home out (past runs, the emulator's state and key), and says so."""
    folder = _project(tmp_path)
    home = folder / "tgnb-home"
    (home / "emulator").mkdir(parents=True)
    (home / "emulator" / "api_key").write_text("tgnb-emulator-key\n", encoding="utf-8")
    (home / "runs" / "old").mkdir(parents=True)
    (home / "runs" / "old" / "events.jsonl").write_text("{}\n", encoding="utf-8")
    monkeypatch.setenv("TGNB_HOME", str(home))
    plan = _plan(folder)
    snap = plan.snapshot
    assert snap is not None and sorted(snap.files) == ["helper.py", "train.py"]
    assert snap.notice() == (
        "tgnb: left tgnb's home tgnb-home/ (its runs, emulator and keys) out of the workdir snapshot"
    )
    plan.discard()
    monkeypatch.setenv("TGNB_HOME", str(tmp_path / "elsewhere"))  # not tgnb's home: shipped
    plan = _plan(folder)
    assert plan.snapshot is not None and plan.snapshot.notice() == ""
    assert "tgnb-home/emulator/api_key" in plan.snapshot.files
    plan.discard()


def test_a_script_left_out_by_the_ignore_file_is_refused(tmp_path: Path, staging: Path) -> None:
    folder = _project(tmp_path)
    (folder / wd.IGNORE_FILE).write_text("*.py\n", encoding="utf-8")
    with pytest.raises(ValidationError, match=r"left out of the snapshot .*\.tgnbignore"):
        _plan(folder)
    assert list(staging.iterdir()) == []  # nothing staged is left behind


def test_a_dataset_in_an_ignored_folder_is_refused_at_launch(tmp_path: Path, staging: Path) -> None:
    """A .tgnbignore that leaves out data/ (docs/own-code.md, "The workdir"): a run that reads its
    dataset from there would fail on the node, so the launch, which reads the snapshot, refuses
    it."""
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


def test_script_arguments_reach_the_program_as_the_strings_given(
    tmp_path: Path, staging: Path
) -> None:
    """docs/own-code.md's ``args=["--lr", "1e-4"]`` (and a number given): the node's config file, run
    by the node's own entry point (``python -m tgnb.train``), sets the script's ``sys.argv`` to
    text. ``1e-4`` was written bare and read back as the float 0.0001, and the script crashed."""
    folder = _project(tmp_path)
    (folder / "train.py").write_text("import sys, json\nprint('ARGV', json.dumps(sys.argv[1:]))\n")
    plan = _plan(folder, args=["--lr", "1e-4", "--wd", 2e-05, "--n", 3, "yes"])
    plan.discard()
    config = tmp_path / node.CONFIG
    config.write_text(node.render_config(plan.spec.train.compact()), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}
    cmd = [sys.executable, "-m", "tgnb.train", str(config), "--run-dir", str(tmp_path / "run")]
    out = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("ARGV "))
    assert json.loads(line[5:]) == ["--lr", "1e-4", "--wd", "2e-05", "--n", "3", "yes"]
    with pytest.raises(ValidationError, match="list of strings"):
        _plan(folder, args=["--flag", True])


@pytest.mark.parametrize("key", ["max_steps", "trl", "model", "lora"])
def test_options_a_script_never_reads_are_refused_with_the_fix(
    tmp_path: Path, staging: Path, key: str
) -> None:
    folder = _project(tmp_path)
    value = {"max_steps": 60, "trl": {"learning_rate": 1e-4}, "model": "tiny", "lora": {"r": 8}}
    flag = key.replace("_", "-")
    with pytest.raises(ValidationError, match=rf"{key}= does not apply to a script.*'--{flag}'"):
        _plan(folder, overrides={key: value[key]})
    assert list(staging.iterdir()) == []


def test_a_configs_own_name_is_the_runs_name(tmp_path: Path, staging: Path) -> None:
    """``name:`` in a %%tg launch body or a YAML file (the config mapping `Session.launch`
    receives) names the run; ``name=`` still wins."""
    folder = _project(tmp_path)
    config = {"algorithm": "script", "script": "train.py", "name": "my-named-run"}
    plan = prelaunch.plan(dict(config), workdir=folder, resources=Resources())
    plan.discard()
    assert plan.spec.name == "my-named-run" and plan.spec.train.name == "my-named-run"
    plan = prelaunch.plan(dict(config), workdir=folder, name="given", resources=Resources())
    plan.discard()
    assert plan.spec.name == "given"
    with pytest.raises(ValidationError, match="name must be a string"):
        prelaunch.plan({**config, "name": 7}, workdir=folder, resources=Resources())


def test_a_script_importing_what_is_not_there_is_refused_at_launch(
    tmp_path: Path, staging: Path
) -> None:
    folder = _project(tmp_path)
    (folder / "pkg").mkdir()
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "train.py").write_text(
        "from __future__ import annotations\nimport json, os.path\nimport helper\n"
        "from pkg import x\ntry:\n    import no_such_optional_mod\nexcept ImportError:\n"
        "    pass\n\ndef main():\n    import no_such_lazy_mod\n"
    )
    _plan(folder).discard()  # the workdir's modules, the stdlib, guarded and lazy imports pass
    (folder / "train.py").write_text("import json\n\nimport no_such_module_tgnb\n")
    with pytest.raises(TgnbError, match=r"imports 'no_such_module_tgnb' \(line 3\).*pip install"):
        _plan(folder)
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize("name", ["TGNB_CONFIG", "TGNB_CHECKPOINT", "TGNB_RUN_DIR", "MASTER_PORT"])
def test_an_env_that_sets_the_node_contract_is_refused(
    tmp_path: Path, staging: Path, name: str
) -> None:
    """The variables tgnb sets on the node (the run file's path among them) cannot be a run's
    ``env``: refused at launch in one line, nothing staged left."""
    with pytest.raises(ValidationError, match=f"env {name} is set by tgnb on the node.*drop it"):
        _plan(_project(tmp_path), env={name: "x"})
    assert list(staging.iterdir()) == []
