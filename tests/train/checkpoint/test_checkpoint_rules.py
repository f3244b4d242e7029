"""What a checkpoint may hold, on synthetic checkpoints (no torch): every file it names a regular
file inside its directory, named once, at most `MAX_FILES`; no links or special files in it; a
checkpoint that is a link is refused and quarantined as a link; retention never follows one. The
same rules through a real restart of a real run: tests/catalogue/test_checkpoint_tampering.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tgnb.train import checkpoint as ck


def make(root: Path, step: int) -> Path:
    path = root / f"checkpoint-{step}"
    (path / "dcp").mkdir(parents=True)
    (path / "dcp" / "__0_0.distcp").write_bytes(os.urandom(256))
    (path / "optimizer.json").write_text("{}")
    ck.write_marker(path, step)
    return path


def add_entry(path: Path, entry: dict[str, Any]) -> None:
    record = json.loads((path / ck.MARKER).read_text())
    record["files"].append(entry)
    (path / ck.MARKER).write_text(json.dumps(record))


def timed_check(path: Path) -> str:
    began = time.monotonic()
    got, reason = ck.check(path)
    assert got is None and reason
    assert time.monotonic() - began < 5
    return reason


ZERO = "0" * 32


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda p: add_entry(p, {"path": "/dev/zero", "size": 0, ck.ALGORITHM: ZERO}), "plain"),
        (lambda p: add_entry(p, {"path": "../x", "size": 0, ck.ALGORITHM: ZERO}), "plain"),
        (lambda p: add_entry(p, {"path": "", "size": 0, ck.ALGORITHM: ZERO}), "empty name"),
        (lambda p: add_entry(p, {"path": "dcp", "size": 0, ck.ALGORITHM: ZERO}), "directory"),
        (lambda p: os.mkfifo(p / "fifo"), "FIFO"),
        (lambda p: os.symlink("/dev/zero", p / "z"), "symbolic link"),
        (lambda p: os.symlink("/etc", p / "dcp" / "d"), "symbolic link"),
    ],
    ids=["abs", "dotdot", "empty", "dir", "fifo", "link-file", "link-dir"],
)
def test_a_checkpoint_naming_anything_but_a_regular_file_inside_is_refused_quickly(
    tmp_path: Path, setup: Any, expected: str
) -> None:
    path = make(tmp_path, 1)
    setup(path)
    assert expected in timed_check(path)


def test_an_entry_listed_twice_or_too_many_is_refused(tmp_path: Path) -> None:
    path = make(tmp_path, 1)
    entry = ck.read_marker(path).files[0].record()  # type: ignore[union-attr]
    add_entry(path, entry)
    assert "listed twice" in timed_check(path)
    record = json.loads((path / ck.MARKER).read_text())
    record["files"] = [{**entry, "path": f"f{i}"} for i in range(ck.MAX_FILES + 1)]
    (path / ck.MARKER).write_text(json.dumps(record))
    assert f"more than {ck.MAX_FILES}" in timed_check(path)


def test_a_marker_that_is_a_link_or_too_large_is_refused(tmp_path: Path) -> None:
    path = make(tmp_path, 1)
    (path / ck.MARKER).unlink()
    os.symlink("/dev/zero", path / ck.MARKER)
    assert "symbolic link" in timed_check(path)
    assert ck.read_marker(path) is None


def test_a_checkpoint_that_is_a_link_is_refused_and_quarantined_as_a_link(tmp_path: Path) -> None:
    outside = make(tmp_path / "outside", 8)
    root = tmp_path / "checkpoints"
    root.mkdir()
    os.symlink(outside, root / "checkpoint-8")
    assert ck.checkpoint_dirs(root) == [] and ck.latest_complete(root) is None
    (link,) = ck.checkpoint_dirs(root, real=False)
    reason = timed_check(link)
    assert "not a directory" in reason
    (root / ck.QUARANTINE).write_text("in the way")  # not a directory: moved aside
    moved = ck.quarantine(link, reason)
    assert (moved / "checkpoint-8").is_symlink() and reason in (moved / "REASON.txt").read_text()
    assert (root / f"{ck.QUARANTINE}.not-a-directory").read_text() == "in the way"
    assert ck.verify(outside) is not None  # the target is untouched


def test_retention_never_follows_a_link(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    outside = make(tmp_path / "outside", 1)
    root.mkdir()
    os.symlink(outside, root / "checkpoint-1")
    make(root, 2)
    newest = ck.verify(make(root, 3))
    assert newest is not None
    removed = ck.rotate(root, 1, newest)
    assert [p.name for p in removed] == ["checkpoint-2"]
    assert ck.verify(outside) is not None and (root / "checkpoint-1").is_symlink()
