"""Atomic, verifiable checkpoints on disk: the completion marker, its manifest, retention, and the
Young/Daly checkpoint interval.

A checkpoint is a directory ``checkpoints/checkpoint-<step>`` in the Hugging Face Trainer's layout
(model, optimizer, scheduler, RNG states, trainer state) or, when a preemption wrote it, one file
(`tgnb.train.express`). A preemption's checkpoint is sealed in its staging directory `STAGING` first
and renamed to ``checkpoint-<step>`` after: between the two (or if the process died there) it is
listed under its staging name, with the step its marker gives. It *counts* only once tgnb has
fsynced every file in it and its directory's name, and then written the completion marker `MARKER`
last (fsynced, then its directory). A marker cut short by a crash is not valid JSON, and neither is
a blank one allocated ahead of time: both read as torn. The marker holds the step, the time, the
total bytes and a manifest of every file with its size and checksum (xxh3-128, which runs at memory
speed; sha256 when ``xxhash`` is not installed; markers of version 1 hold sha256 and are still
read). A directory without a valid marker, with a file missing, shorter, longer or with another
checksum, or with transformers' own ``checkpoint-is-incomplete.txt`` sentinel is *torn*: resume
ignores it and retention removes it. The checksums guard against torn and damaged files, not against
an adversary: a non-cryptographic hash is enough.

This module is light (no torch, no transformers): the notebook side may read checkpoints too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.errors import CheckpointError

#: The completion marker, written last in a checkpoint directory.
MARKER = "tgnb-complete.json"
#: The sentinel transformers' JIT checkpoint keeps in a directory while it is being written.
HF_INCOMPLETE_SENTINEL = "checkpoint-is-incomplete.txt"
#: The directory name prefix the Hugging Face Trainer uses (``PREFIX_CHECKPOINT_DIR``).
PREFIX = "checkpoint-"
#: The directory in which a checkpoint is written and sealed before it is renamed to
#: ``checkpoint-<step>`` (the express checkpoint's spare): a checkpoint once its marker parses.
STAGING = ".spare"
MARKER_VERSION = 2
#: The size of a blank (all spaces) marker file allocated ahead of a checkpoint (`write_marker`).
BLANK_MARKER_BYTES = 4096
#: The checksum algorithms a manifest may name (the key of each file's digest in the marker).
ALGORITHMS = ("xxh3_128", "sha256")
_NAME = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 8 << 20
_LARGE = 16 << 20  # files at least this big are hashed and fsynced in worker threads


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint directory, size, checksum
    (`digest`, hex, computed with `algorithm`: one of `ALGORITHMS`)."""

    path: str
    size: int
    digest: str
    algorithm: str = ALGORITHMS[0]

    def record(self) -> dict[str, Any]:
        """The entry as the marker stores it: ``{"path", "size", <algorithm>: digest}``."""
        return {"path": self.path, "size": self.size, self.algorithm: self.digest}


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its directory, optimizer step, completion time and manifest."""

    path: Path
    step: int
    time: float
    bytes: int
    files: tuple[FileEntry, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.path.name


def step_of(path: Path) -> int | None:
    """The step in a ``checkpoint-<step>`` directory name, or None for any other name."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def checkpoint_dirs(ckpt_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``checkpoint-<step>`` directory under `ckpt_dir`, and `STAGING` when it holds a
    sealed checkpoint not yet renamed, newest step first (a named one first at equal steps)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    steps = {p: step_of(p) or 0 for p in found}
    staged = read_marker(root / STAGING)
    if staged is not None:
        steps[staged.path] = staged.step
        found.append(staged.path)
    return sorted(found, key=lambda p: (steps[p], p.name != STAGING), reverse=True)


def listed_step(path: Path) -> int:
    """The step of a directory `checkpoint_dirs` lists: its name's, or its marker's (`STAGING`)."""
    if path.name == STAGING:
        staged = read_marker(path)
        return staged.step if staged is not None else 0
    return step_of(path) or 0


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file, or a directory so the names created in it (or removed from it) are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_path


def default_algorithm() -> str:
    """xxh3_128 when ``xxhash`` is installed (it comes with ``datasets``), else sha256."""
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "sha256"
    return "xxh3_128"


def _hasher(algorithm: str) -> Any:
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def _hash(path: Path, algorithm: str = "sha256") -> tuple[int, str]:
    digest = _hasher(algorithm)
    size = 0
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def _files(root: Path) -> list[tuple[str, str, int]]:
    """Every file under `root` but the marker, sorted: (path relative to `root`, path, size)."""
    out = []
    todo = [("", str(root))]
    while todo:
        rel, top = todo.pop()
        with os.scandir(top) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    todo.append((f"{rel}{e.name}/", e.path))
                elif e.name != MARKER and not e.name.startswith(f".{MARKER}"):
                    out.append((rel + e.name, e.path, e.stat().st_size))
    return sorted(out)


def _workers(n: int) -> int:
    return max(1, min(n, 8))


@contextlib.contextmanager
def _inline() -> Iterator[Any]:
    """No pool: nothing is large enough to be worth a thread."""
    yield None


def write_marker(
    path: str | os.PathLike[str],
    step: int,
    algorithm: str | None = None,
    known: Iterable[FileEntry] = (),
    **extra: Any,
) -> Checkpoint:
    """Seal a checkpoint directory: fsync every file, then write the completion marker last.

    Large files are hashed (read back from the page cache) and fsynced at the same time, in a few
    threads (xxhash, hashlib and fsync release the GIL), so the checksums cost little beyond the
    flush to disk that durability needs anyway; small files are hashed and fsynced in this thread
    meanwhile (on this machine a thread per small fsync costs more than it saves). Then the
    directories are fsynced (the checkpoint's parent too: its name may just have been made or
    renamed), and only then is the marker written and fsynced, then its directory. A marker cut
    short by a crash does not parse, so the checkpoint reads as torn. When the directory already
    holds a blank marker file big enough (`BLANK_MARKER_BYTES` of spaces, which does not parse
    either; `tgnb.train.express` allocates one), the marker is written over it in place instead,
    so no new file needs flushing.

    `algorithm` is the checksum (`default_algorithm` when None). `known` are entries of files the
    caller has already checksummed *and fsynced* (as `tgnb.train.fastsave` does while writing
    them): those are taken as they are when the file's size matches, not read again. Returns the
    now-complete `Checkpoint`.
    """
    root = Path(path)
    algo = algorithm or default_algorithm()
    _hasher(algo)  # an unknown algorithm fails here, before any work
    files = _files(root)
    given = {e.path: e for e in known}
    ready = {rel: given[rel] for rel, _, size in files if rel in given and given[rel].size == size}
    if any(e.algorithm != algo for e in ready.values()):
        raise ValueError("known entries must use the marker's checksum algorithm")
    todo = [(Path(f), size) for rel, f, size in files if rel not in ready]
    large = sorted((t for t in todo if t[1] >= _LARGE), key=lambda t: t[1], reverse=True)
    digests: dict[str, tuple[int, str]] = {rel: (e.size, e.digest) for rel, e in ready.items()}
    with ThreadPoolExecutor(_workers(2 * len(large))) if large else _inline() as pool:
        tasks = [(f, pool.submit(_hash, f, algo), pool.submit(fsync_path, f)) for f, _ in large]
        for f, size in todo:  # small files here, in this thread, while the pool works on large ones
            if size < _LARGE:
                digests[str(f.relative_to(root))] = _hash(f, algo)
                fsync_path(f)
        for f, hashed, synced in tasks:
            synced.result()
            digests[str(f.relative_to(root))] = hashed.result()
    entries = tuple(FileEntry(rel, *digests[rel], algorithm=algo) for rel, _, _ in files)
    dirs = {os.path.dirname(f) for _, f, _ in files} | {str(root)}
    for d in sorted(dirs, key=len, reverse=True):
        fsync_dir(d)
    fsync_dir(root.parent)  # the checkpoint directory's own name (made, or renamed into place)
    ckpt, raw = marker_record(root, step, entries, **extra)
    put_marker(root, raw)
    return ckpt


def marker_record(
    path: str | os.PathLike[str], step: int, entries: Iterable[FileEntry], **extra: Any
) -> tuple[Checkpoint, bytes]:
    """The checkpoint in `path` and its marker's bytes, for these manifest `entries` (for a
    caller that made the files and names durable itself; `put_marker` writes it)."""
    entries = tuple(entries)
    now = time.time()
    total = sum(e.size for e in entries)
    record = {
        "version": MARKER_VERSION,
        "step": int(step),
        "time": now,
        "bytes": total,
        "files": [e.record() for e in entries],
        **extra,
    }
    raw = json.dumps(record, sort_keys=True).encode()
    return Checkpoint(Path(path), int(step), now, total, entries), raw


def put_marker(path: str | os.PathLike[str], raw: bytes) -> None:
    """Write the marker `raw` into the checkpoint directory `path` and make it durable: over its
    blank marker file in place when it has one, else as a new file (then the directory too)."""
    root = os.fspath(path)
    if not _over_blank(os.path.join(root, MARKER), raw):
        with open(os.path.join(root, MARKER), "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(root)


def _over_blank(path: str, raw: bytes) -> bool:
    """Write `raw` over the blank marker file at `path`, padded with spaces to its size, and
    flush it; False (nothing written) unless `path` is such a file and `raw` fits."""
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        old = os.pread(fd, BLANK_MARKER_BYTES + 1, 0)
        if len(old) < len(raw) or len(old) > BLANK_MARKER_BYTES or old.strip(b" "):
            return False
        os.pwrite(fd, raw + b" " * (len(old) - len(raw)), 0)
        os.fdatasync(fd)
        return True
    finally:
        os.close(fd)


def _entry(f: dict[str, Any]) -> FileEntry:
    for algo in ALGORITHMS:
        if algo in f:
            return FileEntry(str(f["path"]), int(f["size"]), str(f[algo]), algo)
    raise KeyError("no checksum")


def read_marker(path: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint its marker describes, or None when the marker is missing or unreadable."""
    root = Path(path)
    try:
        with open(root / MARKER, encoding="utf-8") as fh:
            record = json.load(fh)
        entries = tuple(_entry(f) for f in record["files"])
        return Checkpoint(
            root, int(record["step"]), float(record["time"]), int(record["bytes"]), entries
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify(path: str | os.PathLike[str], checksums: bool = True) -> Checkpoint | None:
    """The checkpoint at `path` if it is complete, else None (torn, in progress, or not ours).

    Complete means: a readable marker whose step matches the directory name (any step in
    `STAGING`), no transformers "incomplete" sentinel, and every manifest file present with its
    recorded size (and, with `checksums`, its recorded checksum). Files not in the manifest are
    ignored. Raises `CheckpointError` when the checksum's library (xxhash) is missing, rather
    than call it torn.
    """
    root = Path(path)
    if (root / HF_INCOMPLETE_SENTINEL).exists():
        return None
    ckpt = read_marker(root)
    if ckpt is None or not ckpt.files:
        return None
    if root.name != STAGING and ckpt.step != step_of(root):
        return None
    try:
        for entry in ckpt.files:
            if (root / entry.path).stat().st_size != entry.size:
                return None
    except OSError:
        return None
    if checksums:
        for algo in {e.algorithm for e in ckpt.files}:
            try:
                _hasher(algo)
            except ImportError as exc:  # never call a checkpoint torn for want of a library
                raise CheckpointError(
                    f"{root} has {algo} checksums; install xxhash to verify it (pip install xxhash)"
                ) from exc
        try:
            with ThreadPoolExecutor(_workers(len(ckpt.files))) as pool:
                got = list(pool.map(lambda e: _hash(root / e.path, e.algorithm), ckpt.files))
        except OSError:
            return None
        if any(g != (e.size, e.digest) for g, e in zip(got, ckpt.files, strict=True)):
            return None
    return ckpt


def latest_complete(ckpt_dir: str | os.PathLike[str], checksums: bool = True) -> Checkpoint | None:
    """The newest complete checkpoint under `ckpt_dir` (highest step), ignoring torn ones."""
    for path in checkpoint_dirs(ckpt_dir):
        ckpt = verify(path, checksums=checksums)
        if ckpt is not None:
            return ckpt
    return None


def _remove(path: Path) -> None:
    """Remove a checkpoint directory: first its marker (so a half-removed one is torn), then it."""
    try:
        (path / MARKER).unlink()
        fsync_dir(path)
    except OSError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def rotate(
    ckpt_dir: str | os.PathLike[str],
    keep_last: int,
    newest: Checkpoint | None = None,
    protect: Iterable[str | os.PathLike[str]] = (),
) -> list[Path]:
    """Keep the `keep_last` newest complete checkpoints; remove older complete ones and torn ones.

    Torn directories are removed only when they are older than the newest complete checkpoint
    (one with a higher step may be the one being written; `remove_torn` clears those at start-up).
    The newest complete checkpoint is never removed, whatever `keep_last` says. `newest`, when
    given, is the checkpoint just sealed (saves re-hashing it). Markers of the others are checked
    by size only. Returns the removed directories.
    """
    keep_last = max(1, int(keep_last))
    kept = {Path(p).resolve() for p in protect}
    complete: list[Path] = []
    torn: list[Path] = []
    for path in checkpoint_dirs(ckpt_dir):
        is_newest = newest is not None and path.resolve() == newest.path.resolve()
        if is_newest or verify(path, checksums=False) is not None:
            complete.append(path)
        else:
            torn.append(path)
    if not complete:
        return []
    newest_step = listed_step(complete[0])
    kept.update(p.resolve() for p in complete[:keep_last])
    doomed = [p for p in complete[keep_last:] if p.resolve() not in kept]
    doomed += [p for p in torn if listed_step(p) < newest_step and p.resolve() not in kept]
    for path in doomed:
        _remove(path)
    if doomed:
        fsync_dir(ckpt_dir)
    return doomed


def remove_torn(ckpt_dir: str | os.PathLike[str], checksums: bool = True) -> list[Path]:
    """Remove every torn checkpoint directory. Call only when no save is in progress (start-up)."""
    doomed = [p for p in checkpoint_dirs(ckpt_dir) if verify(p, checksums=checksums) is None]
    for path in doomed:
        _remove(path)
    if doomed:
        fsync_dir(ckpt_dir)
    return doomed


def young_daly_seconds(cost_s: float, preemptions_per_hour: float) -> float:
    """Young/Daly optimal checkpoint interval ``sqrt(2 * C * M)`` in seconds.

    `cost_s` (C) is the time one checkpoint takes; M = 3600 / `preemptions_per_hour` is the mean
    time between preemptions. Checkpointing every sqrt(2CM) seconds minimises the expected time
    lost to checkpoints plus recomputation after a preemption (first-order, C << M).
    """
    if cost_s < 0 or preemptions_per_hour <= 0:
        raise ValueError("cost_s must be >= 0 and preemptions_per_hour > 0")
    return math.sqrt(2.0 * cost_s * 3600.0 / preemptions_per_hour)


def young_daly_steps(cost_s: float, preemptions_per_hour: float, step_time_s: float) -> int:
    """The Young/Daly interval converted to optimizer steps with the measured step time (>= 1)."""
    if step_time_s <= 0:
        raise ValueError("step_time_s must be > 0")
    return max(1, round(young_daly_seconds(cost_s, preemptions_per_hour) / step_time_s))
