"""Unit tests of the completion marker, its manifest, verification, retention and Young/Daly.

No torch here: checkpoints are directories of plain files, as the Trainer leaves them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import xxhash

from tgnb.train import checkpoint as ck


def make_ckpt(root: Path, step: int, seal: bool = True, payload: bytes = b"") -> Path:
    path = root / f"checkpoint-{step}"
    (path / "sub").mkdir(parents=True)
    (path / "model.safetensors").write_bytes(payload or os.urandom(4096 + step))
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "sub" / "rng_state_1.pth").write_bytes(b"rng" * step)
    if seal:
        ck.write_marker(path, step)
    return path


def test_marker_is_written_last_with_a_full_manifest(tmp_path: Path) -> None:
    path = make_ckpt(tmp_path, 7, seal=False, payload=b"x" * 10000)
    sealed = ck.write_marker(path, 7, trigger="signal")
    record = json.loads((path / ck.MARKER).read_text())
    assert record["step"] == 7 and record["trigger"] == "signal"
    files = {f["path"]: f for f in record["files"]}
    assert set(files) == {"model.safetensors", "trainer_state.json", "sub/rng_state_1.pth"}
    assert files["model.safetensors"]["size"] == 10000
    assert files["model.safetensors"]["xxh3_128"] == xxhash.xxh3_128(b"x" * 10000).hexdigest()
    assert record["version"] == ck.MARKER_VERSION
    assert record["bytes"] == sum(f["size"] for f in record["files"]) == sealed.bytes
    assert not list(path.glob(".*tmp")), "the temporary marker was renamed into place"
    assert ck.verify(path) == sealed


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing", "no-marker", "sentinel", "bad"])
def test_a_torn_checkpoint_is_not_complete(tmp_path: Path, damage: str) -> None:
    path = make_ckpt(tmp_path, 3)
    model = path / "model.safetensors"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:-1])
    elif damage == "flip":
        data = bytearray(model.read_bytes())
        data[100] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "missing":
        (path / "sub" / "rng_state_1.pth").unlink()
    elif damage == "no-marker":
        (path / ck.MARKER).unlink()
    elif damage == "sentinel":
        (path / ck.HF_INCOMPLETE_SENTINEL).write_text("in progress")
    else:
        (path / ck.MARKER).write_text('{"step": 3, "files": [')
    assert ck.verify(path) is None
    if damage == "flip":  # same size: only the checksum tells
        assert ck.verify(path, checksums=False) is not None


def test_large_files_are_sealed_in_worker_threads(tmp_path: Path) -> None:
    big = os.urandom(1 << 20) * 17  # several 8 MiB read chunks
    path = make_ckpt(tmp_path, 2, seal=False, payload=big)
    (path / "optimizer.pt").write_bytes(big + big[: 3 << 20])
    sealed = ck.write_marker(path, 2)
    by_name = {f.path: f for f in sealed.files}
    assert by_name["model.safetensors"].digest == xxhash.xxh3_128(big).hexdigest()
    assert by_name["optimizer.pt"].size == 20 << 20
    assert ck.verify(path) == sealed


def test_sha256_manifests_are_written_on_request_and_still_verified(tmp_path: Path) -> None:
    """Markers of version 1 (sha256 only) stay readable, and their checksums are still checked."""
    path = make_ckpt(tmp_path, 6, seal=False, payload=b"y" * 5000)
    ck.write_marker(path, 6, algorithm="sha256")
    record = json.loads((path / ck.MARKER).read_text())
    files = {f["path"]: f for f in record["files"]}
    assert files["model.safetensors"]["sha256"] == hashlib.sha256(b"y" * 5000).hexdigest()
    record["version"] = 1
    (path / ck.MARKER).write_text(json.dumps(record))
    assert ck.verify(path) is not None
    (path / "model.safetensors").write_bytes(b"z" * 5000)  # same size, other content
    assert ck.verify(path) is None
    assert ck.verify(path, checksums=False) is not None


def test_an_unknown_algorithm_is_refused_before_any_work(tmp_path: Path) -> None:
    path = make_ckpt(tmp_path, 8, seal=False)
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        ck.write_marker(path, 8, algorithm="md5")
    assert not (path / ck.MARKER).exists()


def test_marker_step_must_match_the_directory(tmp_path: Path) -> None:
    path = make_ckpt(tmp_path, 4, seal=False)
    ck.write_marker(path, 5)
    assert ck.verify(path) is None


def test_latest_complete_skips_newer_torn_ones(tmp_path: Path) -> None:
    assert ck.latest_complete(tmp_path / "nothing") is None
    for step in (2, 10, 9):
        make_ckpt(tmp_path, step)
    make_ckpt(tmp_path, 11, seal=False)
    torn = make_ckpt(tmp_path, 12)
    (torn / "model.safetensors").write_bytes(b"short")
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "README.md").write_text("model card")
    best = ck.latest_complete(tmp_path)
    assert best is not None and best.step == 10 and best.path == tmp_path / "checkpoint-10"


def test_rotate_keeps_the_last_k_and_clears_older_torn(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        make_ckpt(tmp_path, step)
    make_ckpt(tmp_path, 0, seal=False)  # torn, older: removed
    make_ckpt(tmp_path, 9, seal=False)  # torn, newer: may be in progress, kept
    removed = ck.rotate(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["checkpoint-0", "checkpoint-1", "checkpoint-2"]
    assert sorted(p.name for p in ck.checkpoint_dirs(tmp_path)) == [
        "checkpoint-3",
        "checkpoint-4",
        "checkpoint-9",
    ]
    assert ck.remove_torn(tmp_path) == [tmp_path / "checkpoint-9"]
    assert [c.name for c in ck.checkpoint_dirs(tmp_path)] == ["checkpoint-4", "checkpoint-3"]


def test_rotate_never_removes_the_newest_complete(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 5)
    make_ckpt(tmp_path, 6, seal=False)
    assert ck.rotate(tmp_path, keep_last=0) == []
    assert ck.latest_complete(tmp_path) is not None
    assert ck.rotate(tmp_path / "empty", keep_last=1) == []


def test_a_checkpoint_sealed_in_staging_is_listed_with_its_markers_step(tmp_path: Path) -> None:
    """A checkpoint sealed in `STAGING` and not renamed yet (a preemption's, between its seal and
    its rename) is complete: listed, verified and rotated under its staging name."""
    for step in (3, 5):
        make_ckpt(tmp_path, step)
    staging = make_ckpt(tmp_path, 8).rename(tmp_path / ck.STAGING)
    make_ckpt(tmp_path, 9, seal=False)  # torn, newer
    assert [p.name for p in ck.checkpoint_dirs(tmp_path)] == [
        "checkpoint-9",
        ck.STAGING,
        "checkpoint-5",
        "checkpoint-3",
    ]
    best = ck.latest_complete(tmp_path)
    assert best is not None and best.step == 8 and best.path == staging
    assert ck.listed_step(staging) == 8
    assert [p.name for p in ck.rotate(tmp_path, keep_last=2)] == ["checkpoint-3"]
    make_ckpt(tmp_path, 8)  # the same step under its name: listed first
    assert [p.name for p in ck.checkpoint_dirs(tmp_path)][1:3] == ["checkpoint-8", ck.STAGING]
    ck._remove(tmp_path / "checkpoint-8")
    (staging / ck.MARKER).write_bytes(b" " * ck.BLANK_MARKER_BYTES)  # blank: a spare, not listed
    assert ck.STAGING not in [p.name for p in ck.checkpoint_dirs(tmp_path)]
    assert ck.remove_torn(tmp_path) == [tmp_path / "checkpoint-9"]
    assert staging.is_dir()  # a blank spare is never removed as torn


def test_young_daly_interval() -> None:
    # C = 18 s, one preemption an hour: sqrt(2 * 18 * 3600) = 360 s.
    assert ck.young_daly_seconds(18.0, 1.0) == pytest.approx(360.0)
    assert ck.young_daly_seconds(18.0, 4.0) == pytest.approx(180.0)
    assert ck.young_daly_steps(18.0, 1.0, 0.5) == 720
    assert ck.young_daly_steps(0.0, 1.0, 0.5) == 1
    assert ck.young_daly_steps(2.0, 2.0, 3.0) == round(math.sqrt(2 * 2 * 1800) / 3)
    with pytest.raises(ValueError):
        ck.young_daly_seconds(1.0, 0.0)
    with pytest.raises(ValueError):
        ck.young_daly_steps(1.0, 1.0, 0.0)


def test_a_missing_xxhash_is_an_error_not_a_torn_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without xxhash, an xxh3 manifest cannot be checked: say so instead of calling it torn (resume
    removes torn checkpoints). A stand-in import hook hides the installed xxhash."""
    import sys

    from tgnb.errors import CheckpointError

    path = make_ckpt(tmp_path, 9)
    monkeypatch.setitem(sys.modules, "xxhash", None)  # import xxhash now raises ImportError
    with pytest.raises(CheckpointError, match="install xxhash"):
        ck.verify(path)
    assert ck.verify(path, checksums=False) is not None
    assert ck.default_algorithm() == "sha256"
