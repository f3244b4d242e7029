"""The one home of log tailing: a run's log file read whole, or followed as it is written.

Every log on this machine is read here: the local backend's ``train.log`` (`LocalBackend.logs`
yields these raw lines) and a run directory's log when a `Run` has no backend. A backend yields raw
lines; `tgnb.runs.run.Run` alone tells the program's text from the ``@tgnb`` protocol records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path


def read_lines(path: Path) -> list[str]:
    """The lines of `path` so far ([] when it does not exist yet)."""
    if not path.exists():
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def tail(path: Path, finished: Callable[[], bool], poll: float = 0.2) -> Iterator[str]:
    """Yield the lines of `path` as they are written, from its start, until `finished()` says
    the writer is done (read before the last look at the file, so no line is missed); a last
    line without a newline is yielded then. The file may appear late."""
    pos = 0
    buf = ""
    while True:
        done = finished()
        if path.exists():
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos = fh.tell()
            buf += chunk
            *lines, buf = buf.split("\n")
            yield from lines
        if done:
            if buf:
                yield buf
            return
        time.sleep(poll)
