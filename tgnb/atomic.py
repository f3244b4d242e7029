"""Files a reader sees whole: the old version or the new one, never a part.

`atomic_write` is the one way tgnb replaces a file (records, configs, manifests, the emulator's
state): the data goes to a temporary file beside `path`, which is then renamed over it. With
``fsync=True`` the file and the rename are also flushed to disk, so they survive a power cut and
not only a killed process (checkpoint manifests, the emulator's records).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file, or a directory so the names created in it (or removed from it) are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | str,
    *,
    fsync: bool = False,
    mode: int | None = None,
) -> None:
    """Replace `path` with `data` (text is written as UTF-8) in one rename, creating its folder.

    The temporary file is created with the umask's permissions (`mode` sets them instead) and a
    name no other writer shares; it is removed if the write fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:  # the rename too; a file system that cannot fsync a folder keeps the file's
        with contextlib.suppress(OSError):
            fsync_path(path.parent)
