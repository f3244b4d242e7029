"""Checkpoint file writes: checksummed as they are written, and bypassing the page cache.

`HashingFile` is a write-only binary file (``torch.save`` and the safetensors writer of
`tgnb.train.fastsave` write into it) that feeds every byte to the manifest's checksum on the way,
so sealing a checkpoint never reads its files back.

With ``direct=True`` it writes with ``O_DIRECT``: the bytes go through a page-aligned staging
buffer straight to the device instead of into the page cache. A checkpoint taken on preemption is
written once and not read again by this process, so caching it only costs: the kernel must find
(and on a virtual machine whose free memory the host has reclaimed, fault in) a page of cache for
every 4 KiB written. Measured on this project's VMs, writing 800 MB into freshly allocated page
cache took 1.6-2.0 s against 0.19 s into pages freed a moment before, while ``O_DIRECT`` wrote
1.19 GB and fsynced it in 0.68-0.74 s every time. The staging buffers are allocated and touched
once per process (`prepare`) and reused. Where ``O_DIRECT`` is refused (tmpfs, some network or
FUSE file systems) the file is written through the page cache as usual.

The file's last block is padded to the alignment for the write, then the file is truncated to its
true size. The caller fsyncs (`fileno`) and closes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from pathlib import Path
from typing import Any

from tgnb.train import checkpoint as ck

__all__ = ["ALIGN", "STAGING_BYTES", "HashingFile", "prepare"]

#: Alignment of ``O_DIRECT`` writes: offsets, lengths and buffer addresses.
ALIGN = 4096
#: Size of one staging buffer (one ``write`` call each).
STAGING_BYTES = 8 << 20
_free: list[mmap.mmap] = []
_lock = threading.Lock()


def _new_buffer() -> mmap.mmap:
    buf = mmap.mmap(-1, STAGING_BYTES)  # anonymous mappings are page-aligned
    buf.write(bytes(STAGING_BYTES))  # touch every page now, not during a save
    return buf


def prepare(count: int = 2) -> None:
    """Have at least `count` staging buffers ready (each file being written holds one)."""
    with _lock:
        missing = count - len(_free)
    fresh = [_new_buffer() for _ in range(max(0, missing))]
    with _lock:
        _free.extend(fresh)


def _take() -> mmap.mmap:
    with _lock:
        if _free:
            return _free.pop()
    return _new_buffer()


def _give(buf: mmap.mmap) -> None:
    with _lock:
        _free.append(buf)


class HashingFile:
    """A new write-only binary file that checksums every byte written to it."""

    def __init__(self, path: Path, algorithm: str, direct: bool = False) -> None:
        self.path = path
        self.algorithm = algorithm
        self.size = 0
        self._digest = ck._hasher(algorithm)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self._fd = -1
        self._buf: mmap.mmap | None = None
        self._fill = 0
        if direct and hasattr(os, "O_DIRECT"):
            with contextlib.suppress(OSError):  # EINVAL: this file system refuses O_DIRECT
                self._fd = os.open(path, flags | os.O_DIRECT, 0o644)
                self._buf = _take()
        if self._fd < 0:
            self._fd = os.open(path, flags, 0o644)
        self.direct = self._buf is not None  # whether it bypasses the page cache

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._digest.update(view)
        if self._buf is None:
            _write_all(self._fd, view)
        else:
            done = 0
            while done < len(view):
                n = min(STAGING_BYTES - self._fill, len(view) - done)
                self._buf[self._fill : self._fill + n] = view[done : done + n]
                self._fill += n
                done += n
                if self._fill == STAGING_BYTES:
                    self._drain()
        self.size += len(view)
        return len(view)

    def _drain(self) -> None:
        """Write the staged bytes, padded to `ALIGN` (only the last write of a file is padded)."""
        assert self._buf is not None
        padded = -(-self._fill // ALIGN) * ALIGN
        if padded > self._fill:
            self._buf[self._fill : padded] = bytes(padded - self._fill)
        _write_all(self._fd, memoryview(self._buf)[:padded])
        self._fill = 0

    def flush(self) -> None:
        """Nothing to do until `finish` (``torch.save`` calls this)."""

    def finish(self) -> None:
        """Write what is staged and cut the file to the bytes written (before the fsync)."""
        if self._buf is not None and self._fill:
            self._drain()
            os.ftruncate(self._fd, self.size)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._buf is not None:
            _give(self._buf)
            self._buf = None

    def entry(self, root: Path) -> ck.FileEntry:
        rel = str(self.path.relative_to(root))
        return ck.FileEntry(rel, self.size, self._digest.hexdigest(), self.algorithm)


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
