"""The emulator's state on disk, written atomically so a restarted emulator picks up where it was.

Layout under the state directory:

- ``state.json``: every cluster with its nodes, lifecycle events and pending deadlines (absolute
  POSIX times, so a drain window that ended while the emulator was down is processed at start-up),
  plus the admin knobs that outlive a restart (the capacity cap). One that cannot be read is
  renamed ``state.json.corrupt-<UTC time>`` and reported (log, health's ``state_problems``), never
  overwritten.
- ``nodes/<node_name>/``: one directory per node, the workload plane's view (see `tgnb.emulator.lifecycle`).

Every file is written to a temporary name in the same directory, fsynced, then renamed over the
target, so a reader sees either the old or the new content, never a torn one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tgnb.atomic import atomic_write


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` atomically and durably (`atomic_write` with fsync)."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n", fsync=True)


class CorruptState(ValueError):
    """A state file that cannot be read was renamed aside (never overwritten); the message says
    where it is kept."""


def keep_aside(path: Path, why: str) -> CorruptState:
    """Rename the unreadable `path` to ``<name>.corrupt-<UTC time>`` (a new name each time) and
    return the error that reports it, for the caller to log and to start without it."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while kept.exists():
        n += 1
        kept = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, kept)
    return CorruptState(f"{path} is unreadable ({why[:200]}); kept as {kept.name}")


class StateStore:
    """Reads and writes ``state.json`` and the per-node directories under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.state_file = self.root / "state.json"
        self.nodes_dir = self.root / "nodes"
        self.problems: list[str] = []  # files kept aside at load (health reports them)

    def load(self) -> dict[str, Any] | None:
        """The stored state; None when there is none. `CorruptState` (after renaming the file
        aside) when it cannot be read."""
        try:
            text = self.state_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as exc:
            raise self._aside(str(exc)) from None
        try:
            data = json.loads(text)
        except ValueError as exc:  # torn or foreign: kept aside, never overwritten
            raise self._aside(str(exc)) from None
        if not isinstance(data, dict):
            raise self._aside(f"a JSON {type(data).__name__}, not an object")
        return data

    def _aside(self, why: str) -> CorruptState:
        err = keep_aside(self.state_file, why)
        self.problems.append(str(err))
        return err

    def save(self, data: dict[str, Any]) -> None:
        atomic_write_json(self.state_file, data)

    def node_dir(self, node: str) -> Path:
        return self.nodes_dir / node

    def write_node_file(self, node: str, name: str, data: dict[str, Any]) -> Path:
        path = self.node_dir(node) / name
        atomic_write_json(path, data)
        return path
