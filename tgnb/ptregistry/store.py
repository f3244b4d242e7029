"""The registry's files: one JSON file per model resource tgnb creates, named by the create's
idempotency key, under ``<tgnb home>/posttraining/resources/`` (``$TGNB_HOME``, default
``~/.tgnb``: the home the emulator and the run store use).

An `Entry` is written (and fsynced) *before* the create request is sent, so a process killed at
any point leaves a record: the key, the endpoint, what was asked, and the holder (its pid, the
process's start time and the host). The resource id is added when the answer comes, and the
time the service said it became READY (its record's ``updated_at`` read at READY). The file is
removed once the resource is seen stopped. Nothing secret is written: no key, no header.

A holder is alive when a process with its pid runs on this host and started when it did (the
start time tells a reused pid apart); entries of another host count as held.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tgnb.atomic import atomic_write
from tgnb.cloud.client import DEFAULT_BASE_URL, normalize_base_url
from tgnb.events import format_time, utcnow

#: The API's root when none is configured (the SDK's default), as entries name their endpoint.
DEFAULT_ROOT = DEFAULT_BASE_URL


def process_start(pid: int) -> str | None:
    """When process `pid` started, as the kernel counts it (clock ticks since boot, from
    ``/proc/<pid>/stat``); None where there is no such file (not Linux, or no such process)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    rest = raw.rsplit(")", 1)[-1].split()
    return rest[19] if len(rest) > 19 else None


def alive(pid: int, started: str | None) -> bool:
    """Whether process `pid` runs and is the one that started at `started`."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    now = process_start(pid)
    return started is None or now is None or now == started


@dataclass
class Entry:
    """One resource tgnb asked for (see the module docstring)."""

    key: str  # the create's Idempotency-Key, and the file's name
    root: str  # the API root it was sent to (no key)
    base_model: str
    generators: int
    inactive_timeout: int | None
    by: str  # what created it: "tgnb.tinker", "tgnb.posttraining"
    pid: int
    started: str | None  # the holder's process start time (`process_start`)
    host: str
    sent_at: str  # when the create was about to be sent (UTC, this machine's clock)
    resource_id: str | None = None
    ready_at: str | None = None  # the service's updated_at when this holder saw it READY
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        """Whether its holder still runs (entries of another host: assumed so)."""
        if self.host != socket.gethostname():
            return True
        return alive(self.pid, self.started)

    @property
    def mine(self) -> bool:
        return self.host == socket.gethostname() and self.pid == os.getpid()


def root_of(base_url: str | None) -> str:
    """The API root `base_url` names, as entries keep it (the SDK's default for none)."""
    return normalize_base_url(base_url) or DEFAULT_ROOT


#: The entries this process wrote and has not dropped (`mine`): what a signal's handler stops.
_MINE: dict[str, Entry] = {}


def mine() -> list[Entry]:
    """The entries this process created and has not dropped, oldest first."""
    return sorted(_MINE.values(), key=lambda e: e.sent_at)


class Registry:
    """The entries of one tgnb home (see the module docstring)."""

    def __init__(self, home: Path) -> None:
        self.folder = Path(home).expanduser() / "posttraining" / "resources"

    def __repr__(self) -> str:
        return f"<Registry {self.folder}>"

    def new(
        self,
        base_url: str | None,
        base_model: str,
        generators: int,
        inactive_timeout: int | None,
        by: str,
    ) -> Entry:
        """A new entry held by this process, written durably (before its create is sent)."""
        pid = os.getpid()
        entry = Entry(
            key=str(uuid.uuid4()),
            root=root_of(base_url),
            base_model=base_model,
            generators=generators,
            inactive_timeout=inactive_timeout,
            by=by,
            pid=pid,
            started=process_start(pid),
            host=socket.gethostname(),
            sent_at=format_time(utcnow()),
        )
        self.save(entry)
        _MINE[entry.key] = entry
        return entry

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def save(self, entry: Entry) -> None:
        atomic_write(self._path(entry.key), json.dumps(asdict(entry), indent=1), fsync=True)

    def forget(self, entry: Entry) -> None:
        _MINE.pop(entry.key, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(entry.key).unlink()

    def forget_resource(self, resource_id: str) -> None:
        """Drop the entries of `resource_id` (it was seen stopped)."""
        for entry in self.entries():
            if entry.resource_id == resource_id:
                self.forget(entry)

    def entries(self, root: str | None = None) -> list[Entry]:
        """Every readable entry (of the API root `root` only, if given), oldest first."""
        out = list(self._read())
        if root is not None:
            out = [e for e in out if e.root == root]
        return sorted(out, key=lambda e: e.sent_at)

    def any_gone(self) -> bool:
        """Whether an entry's holder is gone (no request made: what a leftover check needs)."""
        return any(not e.held for e in self._read())

    def find(self, resource_id: str) -> Entry | None:
        found = [e for e in self.entries() if e.resource_id == resource_id]
        return found[0] if found else None

    def _read(self) -> Iterator[Entry]:
        if not self.folder.is_dir():
            return
        names = {f.name for f in fields(Entry)}
        for path in self.folder.glob("*.json"):
            try:
                raw = json.loads(path.read_text())
                yield Entry(**{k: v for k, v in raw.items() if k in names})
            except (OSError, ValueError, TypeError):
                continue  # half-written by a crashed older version, or removed meanwhile


__all__ = ["DEFAULT_ROOT", "Entry", "Registry", "alive", "mine", "process_start", "root_of"]
