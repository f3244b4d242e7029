"""Checkpoints on disk: the completion marker and its manifest, verification, quarantine, retention,
and the Young/Daly interval.

A checkpoint is a directory ``checkpoints/checkpoint-<step>``: the `torch.distributed.checkpoint`
shards every rank wrote under ``dcp/``, and small JSON / safetensors files for the rest (written by
`tgnb.train.dcpio`). It *counts* only once every rank has fsynced and checksummed the files it wrote
(`digest`) and rank 0 has fsynced the directories and then written the completion marker `MARKER`
last (to a temporary name, fsynced, renamed, the directory fsynced). The marker holds the step,
the time, the total bytes, the world size, the data position and a manifest of every file with its
size and xxh3-128 checksum (``xxhash``, a dependency of ``tgnb[train]``). A directory without a
valid marker, or with a file missing, of another size or with another checksum, is *torn*; `check`
says which file and why.

A torn checkpoint older than the newest complete one is removed by retention; one found while
choosing where to resume is moved aside into `QUARANTINE` (never deleted) and reported.

This module is light (no torch, no transformers): the notebook side may read checkpoints too.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.errors import CheckpointError

#: The completion marker, written last in a checkpoint directory.
MARKER = "tgnb-complete.json"
#: The directory name prefix (the Hugging Face Trainer's ``PREFIX_CHECKPOINT_DIR``).
PREFIX = "checkpoint-"
#: Where checkpoints that fail verification are moved (under the checkpoints directory).
QUARANTINE = "quarantine"
MARKER_VERSION = 3
FORMAT = "tgnb-dcp-1"
ALGORITHM = "xxh3_128"
#: Suffixes of pickle files: tgnb writes none, and the Trainer ``torch.load``s some it finds
#: (``rng_state.pth``, ``optimizer.pt``, ``scheduler.pt``), so a checkpoint holding one is refused.
PICKLES = (".pt", ".pth", ".bin", ".pkl", ".pickle")
_NAME = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: path relative to the checkpoint, size, checksum."""

    path: str
    size: int
    digest: str

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, ALGORITHM: self.digest}


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: directory, optimizer step, completion time, bytes, manifest and the
    rest of its marker (`meta`: world_size, global_batch, samples, trigger...)."""

    path: Path
    step: int
    time: float
    bytes: int
    files: tuple[FileEntry, ...] = field(default=())
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return self.path.name


def step_of(path: Path) -> int | None:
    """The step in a ``checkpoint-<step>`` directory name, or None for any other name."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def checkpoint_dirs(ckpt_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``checkpoint-<step>`` directory under `ckpt_dir`, newest step first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file, or a directory so the names created in it (or removed from it) are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hasher() -> Any:
    try:
        import xxhash
    except ImportError:  # never call a checkpoint torn for want of a library
        raise CheckpointError(
            "checkpoints are checksummed with xxh3; install xxhash (pip install xxhash)"
        ) from None
    return xxhash.xxh3_128()


def _hash(path: Path) -> tuple[int, str]:
    digest = _hasher()
    size = 0
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def files(root: Path) -> list[str]:
    """Every file under `root` but the marker (and its temporary), relative, sorted."""
    out = []
    for top, _dirs, names in os.walk(root):
        rel = os.path.relpath(top, root)
        for name in names:
            if not name.startswith((MARKER, f".{MARKER}")):
                out.append(name if rel == "." else f"{rel}/{name}")
    return sorted(out)


def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, min(n, 8)))


def digest(path: Path, rels: list[str]) -> list[FileEntry]:
    """Hash and fsync the files `rels` of the checkpoint `path` (a few threads: hashing and fsync
    release the GIL): their manifest entries. Each rank digests the files it wrote."""
    root = Path(path)
    _hasher()  # a missing library fails here, before any work

    def one(rel: str) -> FileEntry:
        size, sum_ = _hash(root / rel)
        fsync_path(root / rel)
        return FileEntry(rel, size, sum_)

    with _pool(len(rels)) as pool:
        return list(pool.map(one, rels))


def write_marker(
    path: str | os.PathLike[str],
    step: int,
    entries: list[FileEntry] | None = None,
    **extra: Any,
) -> Checkpoint:
    """Seal a checkpoint directory: with the manifest `entries` (by default: `digest` every file),
    fsync the directories, then write the marker last, atomically."""
    root = Path(path)
    found = entries if entries is not None else digest(root, files(root))
    entries = sorted(found, key=lambda e: e.path)
    rels = [e.path for e in entries]
    for d in sorted({str((root / r).parent) for r in rels} | {str(root)}, key=len, reverse=True):
        fsync_path(d)
    fsync_path(root.parent)
    now = time.time()
    total = sum(e.size for e in entries)
    record = {
        "version": MARKER_VERSION,
        "format": FORMAT,
        "step": int(step),
        "time": now,
        "bytes": total,
        "files": [e.record() for e in entries],
        **extra,
    }
    tmp = root / f".{MARKER}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(json.dumps(record, sort_keys=True).encode())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / MARKER)
    fsync_path(root)
    return Checkpoint(root, int(step), now, total, tuple(entries), dict(extra))


def read_marker(path: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint its marker describes, or None when the marker is missing or unreadable."""
    root = Path(path)
    try:
        record = json.loads((root / MARKER).read_text(encoding="utf-8"))
        entries = tuple(
            FileEntry(str(f["path"]), int(f["size"]), str(f[ALGORITHM])) for f in record["files"]
        )
        meta = {k: v for k, v in record.items() if k not in ("files", "step", "time", "bytes")}
        return Checkpoint(
            root, int(record["step"]), float(record["time"]), int(record["bytes"]), entries, meta
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check(path: str | os.PathLike[str], checksums: bool = True) -> tuple[Checkpoint | None, str]:
    """``(checkpoint, "")`` when `path` is complete, else ``(None, reason)``; the reason names the
    file at fault (``missing marker``, ``dcp/__0_0.distcp: checksum mismatch``...)."""
    root = Path(path)
    if not (root / MARKER).exists():
        return None, f"{MARKER}: missing (the save did not finish)"
    ckpt = read_marker(root)
    if ckpt is None or not ckpt.files:
        return None, f"{MARKER}: unreadable or empty"
    if step_of(root) is not None and ckpt.step != step_of(root):
        return None, f"{MARKER}: step {ckpt.step} does not match the directory name"
    for e in ckpt.files:
        try:
            size = (root / e.path).stat().st_size
        except OSError:
            return None, f"{e.path}: missing"
        if size != e.size:
            return None, f"{e.path}: {size} bytes, the manifest says {e.size} (truncated or grown)"
    if pickled := [f for f in files(root) if f.endswith(PICKLES)]:
        return (
            None,
            f"{pickled[0]}: a pickle file, which tgnb never writes (the Trainer would load it)",
        )
    if checksums:
        _hasher()  # a missing library is an error, not a torn checkpoint
        with _pool(len(ckpt.files)) as pool:
            got = list(pool.map(lambda e: _hash(root / e.path), ckpt.files))
        for g, e in zip(got, ckpt.files, strict=True):
            if g != (e.size, e.digest):
                return None, f"{e.path}: checksum mismatch (damaged)"
    return ckpt, ""


def verify(path: str | os.PathLike[str], checksums: bool = True) -> Checkpoint | None:
    """The checkpoint at `path` if it is complete, else None."""
    return check(path, checksums)[0]


def latest_complete(ckpt_dir: str | os.PathLike[str], checksums: bool = True) -> Checkpoint | None:
    """The newest complete checkpoint under `ckpt_dir`, ignoring torn ones."""
    for path in checkpoint_dirs(ckpt_dir):
        ckpt = verify(path, checksums=checksums)
        if ckpt is not None:
            return ckpt
    return None


def quarantine(path: Path, reason: str) -> Path:
    """Move a checkpoint that failed verification into ``QUARANTINE`` with a ``REASON.txt`` beside
    its files (never deleted: the operator decides). Returns its new path."""
    dest_dir = path.parent / QUARANTINE
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / f"{path.name}.{int(time.time())}"
    n = 0
    while dest.exists():
        n += 1
        dest = dest_dir / f"{path.name}.{int(time.time())}.{n}"
    os.replace(path, dest)
    (dest / "REASON.txt").write_text(reason + "\n", encoding="utf-8")
    fsync_path(path.parent)
    return dest


def remove(path: Path) -> None:
    """Remove a checkpoint directory: its marker first (a half-removed one is torn), then it."""
    try:
        (path / MARKER).unlink()
        fsync_path(path)
    except OSError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def rotate(ckpt_dir: str | os.PathLike[str], keep_last: int, newest: Checkpoint) -> list[Path]:
    """Keep the `keep_last` newest complete checkpoints (never fewer than `newest`); remove older
    complete ones and torn ones older than `newest` (a newer one may be in progress)."""
    keep_last = max(1, int(keep_last))
    kept = 0
    doomed = []
    for path in checkpoint_dirs(ckpt_dir):
        step = step_of(path) or 0
        if step > newest.step:
            continue
        complete = path == newest.path or verify(path, checksums=False) is not None
        if complete and kept < keep_last:
            kept += 1
        elif step < newest.step or not complete:
            doomed.append(path)
    for path in doomed:
        remove(path)
    if doomed:
        fsync_path(ckpt_dir)
    return doomed


def young_daly_seconds(
    stall_s: float,
    failures_per_hour: float,
    write_s: float = 0.0,
    preemptions_per_hour: float = 0.0,
) -> float:
    """The periodic-save interval tau (s) that costs training least: Young/Daly's optimum
    ``sqrt(2 S M)``, extended to asynchronous saves and to preemptions that come with a notice.

    Per second of training: each save stalls it S = `stall_s` (the whole write for a synchronous
    save); an interruption with no notice (rate λf = `failures_per_hour`, M = 1/λf) loses the work
    since the last complete checkpoint, tau/2 + C on average (C = `write_s`, a save's start to its
    marker); at a preemption with a notice (λp = `preemptions_per_hour`) nothing is lost, but a save
    is in flight with probability C/tau and is waited for, C/2 on average (C = 0 for synchronous
    saves: none is ever in flight). The minimum of (S + λp C²/2)/tau + λf tau/2 lies at
    tau = sqrt((2 S + λp C²) / λf)."""
    if min(stall_s, write_s, preemptions_per_hour) < 0 or failures_per_hour <= 0:
        raise ValueError("stall_s, write_s, preemptions_per_hour >= 0 and failures_per_hour > 0")
    return math.sqrt(
        (2.0 * stall_s * 3600.0 + preemptions_per_hour * write_s**2) / failures_per_hour
    )


def young_daly_steps(
    step_time_s: float,
    stall_s: float,
    failures_per_hour: float,
    write_s: float = 0.0,
    preemptions_per_hour: float = 0.0,
) -> int:
    """`young_daly_seconds` in optimizer steps of `step_time_s` (at least 1)."""
    if step_time_s <= 0:
        raise ValueError("step_time_s must be > 0")
    tau = young_daly_seconds(stall_s, failures_per_hour, write_s, preemptions_per_hour)
    return max(1, round(tau / step_time_s))
