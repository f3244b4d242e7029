"""Unit tests of the completion marker, its manifest, verification, retention and Young/Daly.

No torch here: checkpoints are directories of plain files, as the Trainer leaves them.
"""

from __future__ import annotations

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
    (path / "sub" / "rng-1.safetensors").write_bytes(b"rng" * step)
    if seal:
        ck.write_marker(path, step)
    return path


def test_marker_is_written_last_with_a_full_manifest(tmp_path: Path) -> None:
    path = make_ckpt(tmp_path, 7, seal=False, payload=b"x" * 10000)
    sealed = ck.write_marker(path, 7, trigger="signal")
    record = json.loads((path / ck.MARKER).read_text())
    assert record["step"] == 7 and record["trigger"] == "signal"
    files = {f["path"]: f for f in record["files"]}
    assert set(files) == {"model.safetensors", "trainer_state.json", "sub/rng-1.safetensors"}
    assert files["model.safetensors"]["size"] == 10000
    assert files["model.safetensors"]["xxh3_128"] == xxhash.xxh3_128(b"x" * 10000).hexdigest()
    assert record["version"] == ck.MARKER_VERSION
    assert record["bytes"] == sum(f["size"] for f in record["files"]) == sealed.bytes
    assert not list(path.glob(".*tmp")), "the temporary marker was renamed into place"
    assert record["format"] == ck.FORMAT
    assert ck.verify(path) == sealed


DAMAGE = {
    "truncate": "model.safetensors: 4098 bytes, the manifest says 4099",
    "flip": "model.safetensors: checksum mismatch",
    "missing": "sub/rng-1.safetensors: missing",
    "no-marker": "tgnb-complete.json: missing",
    "bad": "tgnb-complete.json: unreadable",
    "wrong-sum": "trainer_state.json: checksum mismatch",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_torn_checkpoint_is_not_complete_and_check_names_the_file(
    tmp_path: Path, damage: str
) -> None:
    path = make_ckpt(tmp_path, 3, payload=os.urandom(4099))
    model = path / "model.safetensors"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:-1])
    elif damage == "flip":
        data = bytearray(model.read_bytes())
        data[100] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "missing":
        (path / "sub" / "rng-1.safetensors").unlink()
    elif damage == "no-marker":
        (path / ck.MARKER).unlink()
    elif damage == "wrong-sum":  # the marker itself altered: a checksum that is not the file's
        record = json.loads((path / ck.MARKER).read_text())
        entry = next(f for f in record["files"] if f["path"] == "trainer_state.json")
        entry["xxh3_128"] = "0" * 32
        (path / ck.MARKER).write_text(json.dumps(record))
    else:
        (path / ck.MARKER).write_text('{"step": 3, "files": [')
    assert ck.verify(path) is None
    assert DAMAGE[damage] in ck.check(path)[1]
    if damage == "flip":  # same size: only the checksum tells
        assert ck.verify(path, checksums=False) is not None


def test_a_marker_from_digested_parts_equals_one_that_digests_everything(tmp_path: Path) -> None:
    """Ranks digest their own files and rank 0 seals with the gathered entries: the same manifest
    as one process hashing every file; a file changed after its digest is then caught by `check`."""
    path = make_ckpt(tmp_path, 3, seal=False)
    rels = ck.files(path)
    parts = [ck.digest(path, rels[:1]), ck.digest(path, rels[1:])]
    sealed = ck.write_marker(path, 3, entries=parts[1] + parts[0])
    assert sealed.files == ck.write_marker(path, 3).files
    assert [e.path for e in sealed.files] == rels
    (path / rels[0]).write_bytes(b"changed")
    assert ck.check(path)[1].startswith(f"{rels[0]}: ")


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


def test_young_daly_interval() -> None:
    # C = 18 s, one preemption an hour: sqrt(2 * 18 * 3600) = 360 s.
    assert ck.young_daly_seconds(18.0, 1.0) == pytest.approx(360.0)
    assert ck.young_daly_seconds(18.0, 4.0) == pytest.approx(180.0)
    assert ck.young_daly_steps(0.5, 18.0, 1.0) == 720
    assert ck.young_daly_steps(0.5, 0.0, 1.0) == 1
    assert ck.young_daly_steps(3.0, 2.0, 2.0) == round(math.sqrt(2 * 2 * 1800) / 3)
    with pytest.raises(ValueError):
        ck.young_daly_seconds(1.0, 0.0)
    with pytest.raises(ValueError):
        ck.young_daly_seconds(1.0, 0.0, 5.0, preemptions_per_hour=1.0)
    with pytest.raises(ValueError):
        ck.young_daly_steps(0.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("stall", "write", "preemptions", "failures"),
    [(3.8, 90.0, 1.0, 1.0), (3.8, 90.0, 1.0, 0.1), (0.5, 30.0, 4.0, 0.5), (18.0, 0.0, 0.0, 2.0)],
)
def test_the_interval_minimises_the_expected_cost(
    stall: float, write: float, preemptions: float, failures: float
) -> None:
    """Against the cost it claims to minimise, per second of training: the stall of each save, the
    wait for a save in flight at a preemption with a notice, the work an interruption without one
    loses. Found by scanning, not by the formula."""
    lam_p, lam_f = preemptions / 3600, failures / 3600

    def cost(tau: float) -> float:
        return stall / tau + lam_p * write**2 / (2 * tau) + lam_f * (tau / 2 + write)

    best = min((t / 10 for t in range(10, 200_000)), key=cost)
    tau = ck.young_daly_seconds(stall, failures, write, preemptions)
    assert tau == pytest.approx(best, abs=0.1)
    # never more often than Young/Daly counting every interruption as a failure
    assert tau >= ck.young_daly_seconds(stall, preemptions + failures)


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
    with pytest.raises(CheckpointError, match="install xxhash"):  # nor is one sealed without it
        ck.write_marker(make_ckpt(tmp_path, 10, seal=False), 10)
    assert not (tmp_path / "checkpoint-10" / ck.MARKER).exists()


def test_rotate_keeps_the_last_k_and_clears_older_torn(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        make_ckpt(tmp_path, step)
    make_ckpt(tmp_path, 0, seal=False)  # torn, older: removed
    make_ckpt(tmp_path, 9, seal=False)  # torn, newer: may be in progress, kept
    newest = ck.verify(tmp_path / "checkpoint-4")
    assert newest is not None
    removed = ck.rotate(tmp_path, 2, newest)
    assert sorted(p.name for p in removed) == ["checkpoint-0", "checkpoint-1", "checkpoint-2"]
    assert sorted(p.name for p in ck.checkpoint_dirs(tmp_path)) == [
        "checkpoint-3",
        "checkpoint-4",
        "checkpoint-9",
    ]
    assert ck.rotate(tmp_path, 0, newest) == [tmp_path / "checkpoint-3"]  # never the newest
    assert ck.latest_complete(tmp_path) == newest


def test_quarantine_moves_aside_with_the_reason(tmp_path: Path) -> None:
    path = make_ckpt(tmp_path, 5)
    (path / "model.safetensors").write_bytes(b"short")
    ckpt, reason = ck.check(path)
    assert ckpt is None and reason.startswith("model.safetensors:")
    moved = ck.quarantine(path, reason)
    assert not path.exists() and moved.parent == tmp_path / ck.QUARANTINE
    assert (moved / "REASON.txt").read_text().strip() == reason
    assert (moved / "model.safetensors").read_bytes() == b"short"  # kept, not deleted
    assert ck.checkpoint_dirs(tmp_path) == []


@pytest.mark.parametrize("name", ["rng_state.pth", "optimizer.pt", "sub/scaler.pt", "x.pkl"])
def test_a_pickle_file_in_a_checkpoint_is_refused(tmp_path: Path, name: str) -> None:
    """tgnb writes no pickle, and the Trainer would ``torch.load`` one it finds (its RNG state,
    its optimizer): planted beside a complete checkpoint, or sealed into its manifest, it is
    refused by name."""
    path = make_ckpt(tmp_path, 5)
    assert ck.verify(path) is not None
    (path / name).write_bytes(b"\x80\x04N.")  # pickle of None
    ckpt, reason = ck.check(path)
    assert ckpt is None and reason.startswith(f"{name}: a pickle file")
    ck.write_marker(path, 5)  # listed in the manifest now: still refused
    assert ck.check(path, checksums=False)[1].startswith(f"{name}: a pickle file")
