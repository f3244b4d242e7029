"""`tgnb.atomic.atomic_write`: the one way tgnb replaces a file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tgnb.atomic import atomic_write


def test_text_and_bytes_replace_the_file_whole_and_leave_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "folder" / "record.json"
    atomic_write(path, "first\n")
    atomic_write(path, b"second\n", fsync=True)
    assert path.read_bytes() == b"second\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


def test_permissions_follow_the_umask_unless_a_mode_is_given(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "a", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o644  # not mkstemp's 0600
    atomic_write(tmp_path / "b", "x", mode=0o755)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o755


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    atomic_write(path, "old")

    def refuse(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)  # the rename fails as on a full disk
    with pytest.raises(OSError, match="No space"):
        atomic_write(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
