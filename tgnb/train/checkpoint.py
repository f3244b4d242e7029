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

What a checkpoint may hold is narrow, so that a tampered or damaged one is refused quickly and never
reaches outside its directory: the checkpoint is a real directory (not a symbolic link); the marker
and every file it names are regular files (``lstat``: no symbolic link, FIFO, device or directory)
inside that directory, each named once by a plain relative path (no ``..``, no empty or absolute
name), at most `MAX_FILES` of them, in a marker of at most `MAX_MARKER_BYTES`; nothing in the
directory is a symbolic link or a special file. Retention only removes real directories and never
follows a link.

This module is light (no torch, no transformers): the notebook side may read checkpoints too.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.atomic import atomic_write, fsync_path
from tgnb.errors import CheckpointError

#: The completion marker, written last in a checkpoint directory.
MARKER = "tgnb-complete.json"
#: Why a checkpoint directory with no marker is set aside: its save never finished (a kill
#: mid-save), so it never was a checkpoint (`tgnb.train.preemption` may start afresh past it).
UNFINISHED = f"{MARKER}: missing (the save did not finish)"
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
#: The most files one checkpoint may name (a DCP shard and an RNG file per rank, a few JSON files:
#: about 50,000 ranks), and the largest marker read (a manifest entry is about 150 bytes).
MAX_FILES = 100_000
MAX_MARKER_BYTES = 32 << 20
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


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def checkpoint_dirs(ckpt_dir: str | os.PathLike[str], real: bool = True) -> list[Path]:
    """Every ``checkpoint-<step>`` directory under `ckpt_dir`, newest step first: real directories
    only, unless `real` is false (then also what else bears such a name: a symbolic link, a file)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and (not real or _real_dir(p))]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def hasher() -> Any:
    """A new checksum of the manifest's algorithm (`ALGORITHM`: xxh3, 128 bits)."""
    try:
        import xxhash
    except ImportError:  # never call a checkpoint torn for want of a library
        raise CheckpointError(
            "checkpoints are checksummed with xxh3; install xxhash (pip install xxhash)"
        ) from None
    return xxhash.xxh3_128()


def _open(path: Path) -> int:
    """A read descriptor on the regular file `path`: never through a link, never blocking on a
    FIFO (it is refused: the checks before it make that an error of tampering, not of tgnb)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def _hash(path: Path) -> tuple[int, str]:
    digest = hasher()
    size = 0
    with open(_open(path), "rb", buffering=0) as fh:
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
    hasher()  # a missing library fails here, before any work

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
    atomic_write(root / MARKER, json.dumps(record, sort_keys=True), fsync=True)
    return Checkpoint(root, int(step), now, total, tuple(entries), dict(extra))


def _read_record(root: Path) -> dict[str, Any]:
    """The marker's JSON: a regular file (no link, no FIFO) of at most `MAX_MARKER_BYTES`."""
    with open(_open(root / MARKER), "rb") as fh:
        data = fh.read(MAX_MARKER_BYTES + 1)
    if len(data) > MAX_MARKER_BYTES:
        raise ValueError(f"larger than {MAX_MARKER_BYTES} bytes")
    record = json.loads(data.decode("utf-8"))
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record


def read_marker(path: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint its marker describes, or None when the marker is missing or unreadable."""
    root = Path(path)
    if not _real_dir(root):
        return None
    try:
        record = _read_record(root)
        if not isinstance(record["files"], list):
            return None
        entries = tuple(
            FileEntry(str(f["path"]), int(f["size"]), str(f[ALGORITHM])) for f in record["files"]
        )
        meta = {k: v for k, v in record.items() if k not in ("files", "step", "time", "bytes")}
        return Checkpoint(
            root, int(record["step"]), float(record["time"]), int(record["bytes"]), entries, meta
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _bad_name(rel: str) -> str:
    """Why `rel` cannot name a file of a checkpoint ("" when it can)."""
    if not rel:
        return "an empty name"
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        return "not a plain path inside the checkpoint"
    if parts[-1].startswith((MARKER, f".{MARKER}")):
        return "the marker itself"
    return ""


def _strays(root: Path) -> str:
    """The first thing in the checkpoint directory that is neither a regular file nor a real
    directory (a symbolic link, a FIFO, a device...), or that there are too many: a reason, or ""."""
    seen = 0
    todo = [root]
    while todo:
        top = todo.pop()
        with os.scandir(top) as it:
            for entry in it:
                seen += 1
                if seen > 2 * MAX_FILES:
                    return f"more than {2 * MAX_FILES} files"
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    todo.append(Path(entry.path))
                elif not stat.S_ISREG(mode):
                    rel = os.path.relpath(entry.path, root)
                    return f"{rel}: {_kind(mode)}, not a regular file (a checkpoint holds none)"
    return ""


def _manifest_problem(root: Path, ckpt: Checkpoint) -> str:
    """Why the manifest of `ckpt` cannot be trusted to describe files inside `root` ("" if it can):
    its size, names, duplicates, and each file's type and size (``lstat``)."""
    if len(ckpt.files) > MAX_FILES:
        return f"{MARKER}: {len(ckpt.files)} files, more than {MAX_FILES}"
    seen: set[str] = set()
    for e in ckpt.files:
        if why := _bad_name(e.path):
            return f"{e.path!r:.80}: {why}"
        if e.path in seen:
            return f"{e.path}: listed twice in the manifest"
        seen.add(e.path)
        if e.size < 0:
            return f"{e.path}: a negative size in the manifest"
    if stray := _strays(root):
        return stray
    for e in ckpt.files:
        try:
            st = os.lstat(root / e.path)
        except OSError:
            return f"{e.path}: missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{e.path}: {_kind(st.st_mode)}, not a regular file"
        if st.st_size != e.size:
            return f"{e.path}: {st.st_size} bytes, the manifest says {e.size} (truncated or grown)"
    return ""


def check(path: str | os.PathLike[str], checksums: bool = True) -> tuple[Checkpoint | None, str]:
    """``(checkpoint, "")`` when `path` is complete, else ``(None, reason)``; the reason names the
    file at fault (``missing marker``, ``dcp/__0_0.distcp: checksum mismatch``...)."""
    root = Path(path)
    if not _real_dir(root):
        try:
            what = _kind(os.lstat(root).st_mode)
        except OSError:
            what = "missing"
        return None, f"{root.name}: {what}, not a directory (a checkpoint is a real directory)"
    try:
        mode = os.lstat(root / MARKER).st_mode
    except OSError:
        return None, UNFINISHED
    if not stat.S_ISREG(mode):
        return None, f"{MARKER}: {_kind(mode)}, not a regular file"
    ckpt = read_marker(root)
    if ckpt is None or not ckpt.files:
        return None, f"{MARKER}: unreadable, empty or too large"
    if step_of(root) is not None and ckpt.step != step_of(root):
        return None, f"{MARKER}: step {ckpt.step} does not match the directory name"
    try:
        problem = _manifest_problem(root, ckpt)
    except OSError as exc:
        problem = f"unreadable: {type(exc).__name__}: {exc}"
    if problem:
        return None, problem
    if pickled := [f for f in files(root) if f.endswith(PICKLES)]:
        return (
            None,
            f"{pickled[0]}: a pickle file, which tgnb never writes (the Trainer would load it)",
        )
    if checksums:
        hasher()  # a missing library is an error, not a torn checkpoint
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


def _free_name(base: Path) -> Path:
    dest, n = base, 0
    while os.path.lexists(dest):
        n += 1
        dest = base.with_name(f"{base.name}.{n}")
    return dest


def refused_before(ckpt_dir: Path) -> bool:
    """Whether ``QUARANTINE`` holds a checkpoint refused for anything but an unfinished save (a
    damaged or tampered one: a run must not start again from step 0 past it unasked)."""
    found = ckpt_dir / QUARANTINE
    if not _real_dir(found):
        return found.is_dir() or os.path.lexists(found)
    for entry in found.iterdir():
        try:
            reason = (entry / "REASON.txt").read_text(encoding="utf-8").strip()
        except OSError:
            return True
        if reason != UNFINISHED:
            return True
    return False


def quarantine(path: Path, reason: str) -> Path:
    """Move a checkpoint that failed verification into ``QUARANTINE`` with a ``REASON.txt`` beside
    its files (never deleted: the operator decides). Returns its new path. A checkpoint that is not
    a real directory (a link, a file) is moved, as it is, into a directory of that name, beside its
    ``REASON.txt``; whatever stands where ``QUARANTINE`` should be and is not a real directory is
    moved aside first (to ``quarantine.not-a-directory``), never followed."""
    dest_dir = path.parent / QUARANTINE
    if os.path.lexists(dest_dir) and not _real_dir(dest_dir):
        os.replace(dest_dir, _free_name(path.parent / f"{QUARANTINE}.not-a-directory"))
    dest_dir.mkdir(exist_ok=True)
    dest = _free_name(dest_dir / f"{path.name}.{int(time.time())}")
    if _real_dir(path):
        os.replace(path, dest)
    else:
        dest.mkdir()
        os.replace(path, dest / path.name)
    (dest / "REASON.txt").write_text(reason + "\n", encoding="utf-8")
    fsync_path(path.parent)
    return dest


def remove(path: Path) -> None:
    """Remove a checkpoint directory: its marker first (a half-removed one is torn), then it.
    Anything but a real directory (a symbolic link) is left alone: nothing is followed."""
    if not _real_dir(path):
        return
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
