"""The launch path under the third red-team pass (issue 34, items 7-12, 15, 16), through
`Session.launch` on a real emulator daemon and the real Slurm script renderer:

- every duration of a run has a range (`tgnb.runs.durations`): ``drain_poll_seconds=1e10`` killed
  the node's drain watcher (OverflowError), ``backoff_s=1e19`` rendered a negative sleep in the
  sbatch script (bash arithmetic wraps); a ``deadline`` that is NaN, in the past or a duration
  (``6 * 3600``) sent every placement to standard nodes. Each is refused, nothing recorded;
- a workdir over a thousand folders deep: refused with the fix (it crashed the scan with a
  RecursionError);
- a reward in a namespace package (a folder with no ``__init__.py``) of the notebook's folder:
  the folder is shipped and the run's node imports it (it passed the check, then failed on the
  node with "No module named ...");
- a reward module that starts a helper process at import: the check returns when its own process
  does, and the helper is ended with it (the check waited its full timeout on the helper's open
  pipe, and the helper kept running);
- the checks read the snapshot the node gets (a script or dataset an ignore pattern leaves out was
  found in the live folder, then missing on the node), and a folder that changes while the
  snapshot is taken (a file deleted, or swapped for a link) is one line and nothing recorded (a
  bare FileNotFoundError left a recorded "unknown" run holding the name; a link was followed).
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import JobState
from tgnb.backends.slurm.render import render_script
from tgnb.emulator.testing import running_emulator
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.spec import RunSpec
from tgnb.session import Session, attach

from .conftest import record
from .test_python_api import refused

_NOW = time.time()

BAD_DURATIONS: dict[str, dict[str, Any]] = {
    "drain-poll-1e10": {"checkpoint": {"drain_poll_seconds": 1e10}},
    "drain-poll-1e300": {"checkpoint": {"drain_poll_seconds": 1e300}},
    "drain-poll-hour": {"checkpoint": {"drain_poll_seconds": 3600}},
    "every-seconds-1e10": {"checkpoint": {"every_seconds": 1e10}},
    "backoff-1e19": {"recovery": {"backoff_s": 1e19, "backoff_max_s": 1e19}},
    "backoff-max-1e19": {"recovery": {"backoff_max_s": 1e19}},
    "wait-1e10": {"recovery": {"wait_s": 1e10}},
    "deadline-nan": {"recovery": {"deadline": float("nan")}},
    "deadline-inf": {"recovery": {"deadline": float("inf")}},
    "deadline-past": {"recovery": {"deadline": _NOW - 60}},
    "deadline-duration": {"recovery": {"deadline": 6 * 3600}},
    "deadline-milliseconds": {"recovery": {"deadline": (_NOW + 3600) * 1000}},
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    home = tmp_path_factory.mktemp("launch3")
    with running_emulator(home, time_scale=0.01):
        session = attach(local=True, home=home)
        session.scale(preemptible=16)  # a launch is refused at 0: the cases must get past it
        yield session


def _nothing_recorded(session: Session, before: list[str]) -> None:
    assert [r.name for r in session.store.list()] == before


@pytest.mark.parametrize("kw", BAD_DURATIONS.values(), ids=list(BAD_DURATIONS))
def test_a_duration_out_of_its_range_is_refused(session: Session, kw: dict[str, Any]) -> None:
    before = [r.name for r in session.store.list()]
    refused(lambda: session.launch("grpo", dry_run=True, **kw))
    _nothing_recorded(session, before)


@pytest.mark.parametrize(
    "policy",
    [{"backoff_s": 1e19, "backoff_max_s": 1e19}, {"backoff_s": 2.0**62, "backoff_max_s": 2.0**63}],
    ids=["1e19", "2^62"],
)
def test_the_sbatch_script_never_renders_a_backoff_bash_cannot_hold(policy: dict[str, Any]) -> None:
    """Refused by the spec as it is built (the contract checks itself), before any rendering."""
    train = {"algorithm": "grpo"}
    refused(
        lambda: render_script(
            RunSpec(name="run", train=train, recovery=RecoveryPolicy(**policy)), "/shared/runs/run"
        )
    )


@pytest.fixture
def deep(tmp_path: Path) -> Iterator[Path]:
    """A folder 1,100 folders deep (``d/d/.../d``), removed afterwards from the bottom up (a
    recursive removal would meet the recursion limit it tests)."""
    depth, here = 1100, os.getcwd()
    try:
        os.chdir(tmp_path)
        for _ in range(depth):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    yield tmp_path
    os.chdir(tmp_path / "/".join(["d"] * depth))
    try:
        for _ in range(depth):
            os.chdir("..")
            os.rmdir("d")
    finally:
        os.chdir(here)


def test_a_workdir_too_deep_is_refused(session: Session, deep: Path) -> None:
    (deep / "train.py").write_text("print('hi')\n")
    before = [r.name for r in session.store.list()]
    exc = refused(lambda: session.launch("train.py", workdir=deep))
    assert ".tgnbignore" in str(exc)
    _nothing_recorded(session, before)


_REWARD = "def reward(completions, **kwargs):\n    return [0.0 for _ in completions]\n"


@pytest.fixture
def notebook_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The process as a notebook kernel is (faked: pytest's ``__main__`` is a file): no
    ``__main__`` file, the notebook's folder the working directory and on ``sys.path``."""
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.slow
def test_a_reward_in_a_namespace_package_ships_the_workdir(
    session: Session, notebook_folder: Path
) -> None:
    (notebook_folder / "nsrewards").mkdir()  # no __init__.py: a namespace package
    (notebook_folder / "nsrewards" / "mine.py").write_text(_REWARD)
    run = session.launch("grpo", rewards=["nsrewards.mine:reward"], max_steps=1, preemptible=False)
    try:
        status = run.wait(timeout=600, progress=False)
    finally:
        run.stop()
    shipped = run.record.spec.workdir == str(notebook_folder)
    ok = shipped and status.state == JobState.SUCCEEDED
    record(ok)
    assert shipped, run.record.spec.workdir
    assert status.state == JobState.SUCCEEDED, (status, run.error)


@pytest.mark.slow
def test_a_reward_module_starting_a_helper_has_its_tree_ended(
    session: Session, tmp_path: Path
) -> None:
    from tgnb.emulator.home import alive

    pids = tmp_path / "helpers"
    (tmp_path / "helper_reward.py").write_text(
        "import subprocess, sys\n"
        "_helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'],"
        " start_new_session=True)\n"  # its own session: out of the check's process group
        f"with open({str(pids)!r}, 'a') as fh:\n"
        "    fh.write(f'{_helper.pid}\\n')\n" + _REWARD
    )
    text = session.launch(
        "grpo", rewards=["helper_reward:reward"], workdir=tmp_path, preemptible=False, dry_run=True
    )
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 60  # killed already; their reaping by init may lag
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in started if alive(p)]
    record(not left and "helper_reward:reward" in text)
    assert started and not left, f"helpers still running: {left}"
    assert "helper_reward:reward" in text


def _project(tmp_path: Path, ignore: str) -> Path:
    """A user's folder: a script importing its helper module, a data file, an ignore file."""
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "train.py").write_text("import helper\nprint(helper.VALUE)\n", encoding="utf-8")
    (folder / "helper.py").write_text("VALUE = 1\n", encoding="utf-8")
    (folder / "data" / "sft.jsonl").write_text('{"prompt": "1+1=", "completion": "2"}\n')
    (folder / ".tgnbignore").write_text(ignore, encoding="utf-8")
    return folder


SNAPSHOT_CASES: dict[str, tuple[str, dict[str, Any]]] = {  # item 8: .tgnbignore, what to launch
    "script-ignored": ("*.py\n", {"what": "train.py"}),
    "data-ignored": (
        "data/\n",
        {"what": {"algorithm": "sft", "model": "tiny", "dataset": "data/sft.jsonl"}},
    ),
}


@pytest.mark.parametrize("case", SNAPSHOT_CASES.values(), ids=list(SNAPSHOT_CASES))
def test_the_launch_checks_the_snapshot_the_node_gets(
    session: Session, tmp_path: Path, case: tuple[str, dict[str, Any]]
) -> None:
    """Item 8: what an ignore pattern leaves out of the snapshot is missing at launch, as it would
    be on the node (the checks read the live folder, where it was)."""
    ignore, kw = case
    folder = _project(tmp_path, ignore)
    before = [r.name for r in session.store.list()]
    refused(lambda: session.launch(workdir=folder, max_steps=2, dry_run=True, **kw))
    _nothing_recorded(session, before)


@pytest.mark.parametrize("change", ["deleted", "linked"])
def test_a_folder_changing_while_the_snapshot_is_taken_records_nothing(
    session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Item 12: a file deleted, or swapped for a link to a file outside the folder, between the
    listing and the copy (the user saving while launching; made to happen there by wrapping the
    real listing): one line naming the fix, no link followed, nothing recorded, the name free."""
    from tgnb.runs import workdir as wd

    folder = _project(tmp_path, "data/\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not for the node\n", encoding="utf-8")
    real_scan = wd.scan

    def scan_then_change(root: Any, *a: Any, **kw: Any) -> wd.Snapshot:
        listed = real_scan(root, *a, **kw)
        (folder / "helper.py").unlink()
        if change == "linked":
            (folder / "helper.py").symlink_to(outside)
        return listed

    before = [r.name for r in session.store.list()]
    with monkeypatch.context() as m:
        m.setattr(wd, "scan", scan_then_change)
        exc = refused(lambda: session.launch("train.py", workdir=folder, name="changing"))
    assert ("disappeared" if change == "deleted" else "holds a link") in str(exc)
    _nothing_recorded(session, before)
    assert session.store.find("changing") is None
