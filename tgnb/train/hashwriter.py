"""A DCP storage writer that checksums each file as it writes it, so a checkpoint's bytes are
written once and never read back to be hashed (at scale, re-reading every shard would double the
I/O inside the drain window).

`HashingWriter` is DCP's own `FileSystemWriter` (its planning, threads, fsync and metadata step
unchanged) over a file system whose write streams pass every byte through the manifest's
checksum (`tgnb.train.checkpoint.hasher`) on its way to the file. When a file is closed, its size
and checksum land in `entries`, keyed by its path relative to the checkpoint; the metadata file,
written last by DCP's ``finish`` under a temporary name and renamed, is recorded under its final
name. `tgnb.train.saving` puts these entries in the manifest and digests only the files it wrote
itself (JSON, RNG states).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from tgnb.train import checkpoint as ck


class _HashingStream:
    """A file open for writing whose bytes are checksummed as they are written."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._sum = ck.hasher()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sum.update(view)
        self.size += view.nbytes
        return int(self._fh.write(view))

    def tell(self) -> int:
        return int(self._fh.tell())

    def fileno(self) -> int:
        return int(self._fh.fileno())

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.flush()  # the file itself is closed by the context that opened it

    def writable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        return str(self._sum.hexdigest())


class _HashingFileSystem(FileSystem):
    def __init__(self, root: Path, entries: dict[str, ck.FileEntry]) -> None:
        super().__init__()
        self.root, self.entries = root, entries
        self._lock = threading.Lock()

    def _rel(self, path: str | os.PathLike[str]) -> str:
        return Path(path).relative_to(self.root).as_posix()

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as plain:
                yield plain
            return
        with open(path, "wb") as fh:
            hashing = _HashingStream(fh)
            yield hashing
        rel = self._rel(path)
        with self._lock:
            self.entries[rel] = ck.FileEntry(rel, hashing.size, hashing.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        old, new = self._rel(path), self._rel(new_path)
        with self._lock:
            if old in self.entries:
                entry = self.entries.pop(old)
                self.entries[new] = ck.FileEntry(new, entry.size, entry.digest)


class HashingWriter(FileSystemWriter):
    """`FileSystemWriter` into `path` (a folder of the checkpoint `checkpoint`) that records the
    manifest entry of every file it writes in `entries` (paths relative to `checkpoint`)."""

    def __init__(self, path: Path, checkpoint: Path) -> None:
        super().__init__(path)
        ck.hasher()  # a missing library fails here, before any work
        self.entries: dict[str, ck.FileEntry] = {}
        self.fs = _HashingFileSystem(Path(checkpoint), self.entries)
