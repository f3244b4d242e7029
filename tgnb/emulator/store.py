"""The emulator's state on disk, written atomically so a restarted emulator picks up where it was.

Layout under the state directory:

- ``state.json``: every cluster with its nodes, lifecycle events and pending deadlines (absolute
  POSIX times, so a drain window that ended while the emulator was down is processed at start-up),
  plus the admin knobs that outlive a restart (the capacity cap).
- ``nodes/<node_name>/``: one directory per node, the workload plane's view (see `tgnb.emulator.fleet`).

Every file is written to a temporary name in the same directory, fsynced, then renamed over the
target, so a reader sees either the old or the new content, never a torn one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` atomically (temp file + fsync + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


class StateStore:
    """Reads and writes ``state.json`` and the per-node directories under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.state_file = self.root / "state.json"
        self.nodes_dir = self.root / "nodes"

    def load(self) -> dict[str, Any] | None:
        try:
            text = self.state_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        data = json.loads(text)
        return data if isinstance(data, dict) else None

    def save(self, data: dict[str, Any]) -> None:
        atomic_write_json(self.state_file, data)

    def node_dir(self, node: str) -> Path:
        return self.nodes_dir / node

    def write_node_file(self, node: str, name: str, data: dict[str, Any]) -> Path:
        path = self.node_dir(node) / name
        atomic_write_json(path, data)
        return path
