"""The emulator home (``$TGNB_HOME/emulator/``, default ``~/.tgnb/emulator``): its files and the
process they name.

- ``server.json``: ``{pid, host, port, started_at, options, owner}`` of the running server (written
  once it listens): the `ServeOptions` it runs with, and the ``$TGNB_EMULATOR_OWNER`` of the command
  that started it (`start` restarts, and ``tgnb notebooks run --stop`` stops, only its own);
- ``emulator.log``: the server's output; ``state/``: its persisted fleet (`tgnb.emulator.store`);
- ``api_key`` (mode 0600): the key clients must send, generated once unless ``--api-key`` or
  ``TGNB_EMULATOR_API_KEY`` gives one; ``lock``: held by the running server, so two never share a home
  (`status` and `stop` trust a ``server.json`` only when its pid holds this lock).

`EmulatorStatus` is what a home says of its server; `tgnb.emulator.daemon` starts, finds and stops
it with the helpers here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shlex
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgnb.config import EMULATOR_OWNER_ENV, Secret, default_home, register_secret
from tgnb.errors import EmulatorError

KEY_ENV = "TGNB_EMULATOR_API_KEY"
#: A token naming the command that starts the daemon (``tgnb notebooks run`` sets one for its
#: kernels): a daemon whose owner is the caller's may be restarted or stopped by it.
OWNER_ENV = EMULATOR_OWNER_ENV
HOST = "127.0.0.1"


@dataclass(frozen=True)
class EmulatorStatus:
    """Where a running emulator answers and with which key. `base_url` has no ``/v1``."""

    running: bool
    home: Path
    pid: int | None = None
    port: int | None = None
    api_key: Secret | None = None
    options: dict[str, Any] | None = None  # the ServeOptions it runs with (None: not recorded)
    owner: str | None = None  # the $TGNB_EMULATOR_OWNER of the command that started it

    @property
    def base_url(self) -> str | None:
        return f"http://{HOST}:{self.port}" if self.port else None

    @property
    def log_path(self) -> Path:
        return self.home / "emulator.log"

    @property
    def state_dir(self) -> Path:
        return self.home / "state"

    def describe(self) -> str:
        if not self.running:
            return f"emulator: not running (home {self.home})"
        scale = (self.options or {}).get("time_scale")
        scaled = f", time scale {scale:g}" if isinstance(scale, int | float) else ""
        return (
            f"emulator: running, pid {self.pid}, {self.base_url}{scaled}\n"
            f"  key file {self.home / 'api_key'}, log {self.log_path}, state {self.state_dir}\n"
            f"  export TOGETHER_BASE_URL={self.base_url}\n"
            f'  export TOGETHER_API_KEY="$(cat {shlex.quote(str(self.home / "api_key"))})"'
        )


def emulator_home(home: Path | None = None) -> Path:
    """``<tgnb home>/emulator``."""
    return Path(home or default_home()).expanduser() / "emulator"


def api_key(home: Path, explicit: str | None = None) -> str:
    """The key: `explicit`, else ``$TGNB_EMULATOR_API_KEY``, else the saved one, else a new one."""
    path = home / "api_key"
    key = explicit or os.environ.get(KEY_ENV)
    if not key:
        try:
            key = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            key = None
    if not key:
        key = "tgnb-emu-" + secrets.token_urlsafe(24)
    home.mkdir(parents=True, exist_ok=True)
    current = path.read_text(encoding="utf-8").strip() if path.exists() else None
    if current != key:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(key + "\n")
    os.chmod(path, 0o600)
    register_secret(key)
    return key


def saved_key(eh: Path) -> str | None:
    """The key the running daemon uses (its file; the environment is only read at start)."""
    try:
        key = (eh / "api_key").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    register_secret(key)
    return key or None


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def read_server(home: Path) -> dict[str, Any] | None:
    """The ``server.json`` of emulator home `home`, checked as any input is (a crashed daemon, a
    full disk or a hand edit may have left anything): a JSON object whose ``pid`` is a process id
    (an integer above 1) and ``port`` a TCP port, ``options`` an object or absent. None: none,
    or not such a record (then no process is trusted, signalled or asked from it)."""
    try:
        data = json.loads((home / "server.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, port, options = data.get("pid"), data.get("port"), data.get("options")
    if not (_whole(pid, 2, 2**22 - 1) and _whole(port, 1, 65535)):
        return None
    return data if options is None or isinstance(options, dict) else None


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def current_owner() -> str | None:
    """The ``$TGNB_EMULATOR_OWNER`` of the current command (None: unset)."""
    return os.environ.get(OWNER_ENV) or None


def port_free(port: int) -> bool:
    """Whether `port` can be bound on `HOST` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def is_emulator(pid: int) -> bool:
    """Whether `pid` runs ``tgnb.emulator`` (its command line; True without ``/proc``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"tgnb.emulator" in fh.read()
    except FileNotFoundError:
        return True  # no /proc (macOS): trust server.json


def serves(pid: int, eh: Path, *, probe: bool = True) -> bool:
    """Does `pid` hold this home's ``lock`` (so a ``server.json`` copied from, or pointing at,
    another home never gets that home's server killed)? Read from ``/proc/locks``; without it,
    whether anyone holds the lock (`probe`: by trying to take it) or, not probing, True."""
    lock = eh / "lock"
    try:
        inode = os.stat(lock).st_ino
    except FileNotFoundError:
        return False
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            table = fh.read()
    except OSError:  # no /proc (macOS): is the lock held at all?
        if not probe:
            return True
        with open(lock, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
    for line in table.splitlines():
        parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 7746 fe:00:2149001 0 EOF"
        held = len(parts) >= 6 and parts[1] == "FLOCK" and parts[4] == str(pid)
        if held and parts[5].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


@contextlib.contextmanager
def home_lock(eh: Path) -> Iterator[None]:
    """Hold emulator home `eh`'s ``lock`` while serving; `EmulatorError` when a server holds it."""
    eh.mkdir(parents=True, exist_ok=True)
    fh = open(eh / "lock", "a+")  # noqa: SIM115
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = read_server(eh) or {}
            raise EmulatorError(
                f"an emulator already runs for {eh} (pid {info.get('pid', '?')}); "
                "stop it with 'tgnb emulator stop' or use another TGNB_HOME"
            ) from None
        yield
    finally:
        fh.close()
