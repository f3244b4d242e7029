"""Run the emulator: in the foreground (`serve`) or as a detached daemon (`start`, `stop`, `status`).

Everything lives under ``$TGNB_HOME/emulator/`` (default ``~/.tgnb/emulator``):

- ``server.json``: ``{pid, host, port, started_at, options, owner}`` of the running server (written
  once it listens): the `ServeOptions` it runs with, and the ``$TGNB_EMULATOR_OWNER`` of the command
  that started it (`start` restarts, and ``tgnb notebooks run --stop`` stops, only its own);
- ``emulator.log``: the server's output; ``state/``: its persisted fleet (`tgnb.emulator.store`);
- ``api_key`` (mode 0600): the key clients must send, generated once unless ``--api-key`` or
  ``TGNB_EMULATOR_API_KEY`` gives one; ``lock``: held by the running server, so two never share a home
  (`status` and `stop` trust a ``server.json`` only when its pid holds this lock).

Numeric options are checked against `OPTION_RANGES` before anything starts (`check_options`).

`start` launches ``serve`` in a new session through a shell that exits at once, so the daemon is
nobody's child: it keeps running after the starting process (a test, a Jupyter kernel) exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import httpx

from tgnb.config import EMULATOR_OWNER_ENV, Secret, default_home, register_secret
from tgnb.emulator.admin import AdminClient
from tgnb.emulator.fleet import FleetConfig
from tgnb.emulator.models import DEFAULT_PROJECT_ID
from tgnb.emulator.store import atomic_write_json
from tgnb.errors import EmulatorError, EmulatorMismatchError, ValidationError

KEY_ENV = "TGNB_EMULATOR_API_KEY"
#: A token naming the command that starts the daemon (``tgnb notebooks run`` sets one for its
#: kernels): a daemon whose owner is the caller's may be restarted or stopped by it.
OWNER_ENV = EMULATOR_OWNER_ENV
RL_PRICE_ENV = "TGNB_EMULATOR_RL_PRICE"  # $ per GPU-hour of Post-Training resources (default 9)
HOST = "127.0.0.1"
#: How `differences` names the options a running emulator was asked for, with the fix's flag.
_LABELS = {
    "time_scale": "time scale",
    "drain_window_s": "drain window",
    "provision_delay_s": "provision delay",
    "preemption_rate": "preemption rate",
    "seed": "seed",
    "capacity_gpus": "capacity",
    "capacity_trace": "capacity trace",
    "chaos": "chaos",
    "chaos_seed": "chaos seed",
    "chaos_delay_s": "chaos delay",
    "project_id": "project",
    "port": "port",
}


#: The `FleetConfig` knobs a daemon takes on its command line, by their flat names.
FLEET_KNOBS = (
    "time_scale",
    "drain_window_s",
    "provision_delay_s",
    "preemption_rate",
    "seed",
    "capacity_gpus",
)

_NOT_FLAT = ("port", "fleet")  # port comes first in the flat view; the fleet is spread out

#: The range of each numeric option (flat name -> (low, high), both included). A time scale under
#: 0.001 prunes every lifecycle event at once (retention 72 h x scale); chaos is a fraction.
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "port": (0, 65535),
    "time_scale": (0.001, 1000.0),
    "drain_window_s": (0.0, 86400.0),
    "provision_delay_s": (0.0, 86400.0),
    "preemption_rate": (0.0, 3600.0),
    "seed": (-(2**63), 2**63 - 1),
    "capacity_gpus": (0, 1_000_000),
    "chaos": (0.0, 1.0),
    "chaos_seed": (-(2**63), 2**63 - 1),
    "chaos_delay_s": (0.0, 3600.0),
    "rl_price_per_gpu_hour": (0.0, 1_000_000.0),
}


def check_options(flat: dict[str, Any]) -> None:
    """Refuse an option out of `OPTION_RANGES` (or not finite) with a one-line
    `ValidationError` naming the flag and its range; None (not given) passes."""
    for name, (lo, hi) in OPTION_RANGES.items():
        value = flat.get(name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-").removesuffix("-gpus")
        integral = isinstance(lo, int) and isinstance(hi, int)
        kind = "an integer" if integral else "a number"
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and (isinstance(value, int) or not integral) and math.isfinite(value)
        if not ok or not lo <= value <= hi:
            raise ValidationError(
                f"{flag} must be {kind} in [{_shown(lo)}, {_shown(hi)}], got {value!r}"
            )


@dataclass
class ServeOptions:
    """One emulator server: its port, its fleet's `FleetConfig` (durations in platform seconds,
    scaled by ``time_scale``; ``default_project_id`` the project), chaos and the Post-Training
    knobs. `ServeOptions.of` takes the flat names of the command line (``time_scale=0.02``,
    ``project_id=...``); `flat` gives them back, as ``server.json`` records them."""

    port: int = 0  # 0: a free port
    fleet: FleetConfig = field(default_factory=FleetConfig)
    chaos: float = 0.0
    chaos_seed: int = 0
    chaos_delay_s: float = 65.0
    rl_price_per_gpu_hour: float | None = None  # None: $TGNB_EMULATOR_RL_PRICE, else 9.0
    rl_models: str | None = None  # extra local model dirs for /v1/rl (os.pathsep-separated)
    capacity_trace: str | None = None  # a capacity trace file, JSON or YAML (`tgnb.emulator.trace`)

    @classmethod
    def of(cls, **flat: Any) -> ServeOptions:
        """From flat names: `FLEET_KNOBS` and ``project_id`` (None: the default project) go into
        the `FleetConfig`, the rest are this class's own fields."""
        knobs = {name: flat.pop(name) for name in FLEET_KNOBS if name in flat}
        project = flat.pop("project_id", None)
        if project is not None:
            knobs["default_project_id"] = project
        return cls(fleet=FleetConfig(**knobs), **flat)

    def flat(self) -> dict[str, Any]:
        """Every option by its flat name; ``project_id`` is None for the default project."""
        project = self.fleet.default_project_id
        out: dict[str, Any] = {"port": self.port}
        out.update({name: getattr(self.fleet, name) for name in FLEET_KNOBS})
        out["project_id"] = None if project == DEFAULT_PROJECT_ID else project
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_FLAT})
        return out

    def check(self) -> ServeOptions:
        """`check_options` on these options, and the capacity trace file read and checked; self."""
        check_options(self.flat())
        self.trace()
        return self

    def trace(self) -> Any:
        """The `CapacityTrace` of `capacity_trace` (None: no file); `ValidationError` naming
        the file and the fix when it cannot be read or is not a valid trace."""
        from tgnb.emulator.trace import load_file

        if self.capacity_trace is None:
            return None
        try:
            return load_file(self.capacity_trace)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def to_argv(self) -> list[str]:
        argv = []
        for name, value in self.flat().items():
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        return argv


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
            f"  export TOGETHER_BASE_URL={self.base_url}"
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


def _saved_key(eh: Path) -> str | None:
    """The key the running daemon uses (its file; the environment is only read at start)."""
    try:
        key = (eh / "api_key").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    register_secret(key)
    return key or None


def _alive(pid: int) -> bool:
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


def _read_server(home: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((home / "server.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def status(home: Path | None = None, timeout: float = 3.0) -> EmulatorStatus:
    """Is an emulator running for this tgnb home? Checks the pid and asks its health endpoint."""
    eh = emulator_home(home)
    info = _read_server(eh)
    pid = int(info.get("pid", 0)) if info else 0
    if not info or not _alive(pid) or not _serves(pid, eh, probe=False):
        return EmulatorStatus(running=False, home=eh)  # none, or another home's server
    key = _saved_key(eh)
    port = int(info["port"])
    try:
        with AdminClient(f"http://{HOST}:{port}", key, timeout=timeout) as admin:
            ok = admin.health().get("pid") == info["pid"]
    except (httpx.HTTPError, ValueError):
        ok = False
    options = info.get("options")
    return EmulatorStatus(
        running=ok,
        home=eh,
        pid=int(info["pid"]),
        port=port,
        api_key=Secret(key) if key else None,
        options=options if isinstance(options, dict) else None,
        owner=info.get("owner") or None,
    )


def differences(
    running: EmulatorStatus, asked: ServeOptions, fields_asked: Iterable[str] | None = None
) -> list[str]:
    """What `running` does not match of `asked` (only `fields_asked`, by default every option but
    a port of 0), as ``"time scale 1 (asked 0.02)"``; empty when it matches or recorded nothing."""
    have = running.options
    if have is None:
        return []
    wanted = asked.flat()
    names = list(fields_asked) if fields_asked is not None else list(wanted)
    out = []
    for name in names:
        want = wanted[name]
        if want is None or (name == "port" and not want):  # not asked: whatever runs will do
            continue
        if name == "port":
            got: Any = running.port
        elif name in have:
            got = have[name]
        else:
            continue
        if got != want:
            label = _LABELS.get(name, name)
            out.append(f"{label} {_shown(got)} (asked {_shown(want)})")
    return out


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _owner() -> str | None:
    return os.environ.get(OWNER_ENV) or None


def owned(st: EmulatorStatus) -> bool:
    """Did the current command start this emulator (the same ``$TGNB_EMULATOR_OWNER``)?"""
    return st.owner is not None and st.owner == _owner()


def start(
    home: Path | None = None,
    options: ServeOptions | None = None,
    key: str | None = None,
    timeout: float = 30.0,
    *,
    asked: Iterable[str] | None = None,
) -> tuple[EmulatorStatus, bool]:
    """Start the daemon unless one runs for this home; return (status, started_now).

    A running one is reused when it matches `options` (the fields in `asked`; by default all of
    them). When it does not: restarted with `options` if the current command started it (`owned`),
    else `EmulatorMismatchError`, which names what differs and the fix. After a crash (a
    ``server.json`` left by a daemon that is gone) it comes back with the options it had
    (`after_crash`): every option not in `asked`, and its port when that is free and none is asked,
    so the base URL a running client holds stays valid.
    """
    options = (options or ServeOptions()).check()  # before anything starts
    eh = emulator_home(home)
    current = status(home)
    if not current.running:
        options = after_crash(eh, options, asked)
    if current.running:
        diff = differences(current, options, asked)
        if not diff:
            return current, False
        if not owned(current):
            raise EmulatorMismatchError(
                f"the local emulator running for {eh} (pid {current.pid}) has "
                f"{', '.join(diff)}: stop it first with `tgnb emulator stop`, ask for what it "
                "runs with, or use another tgnb home (TGNB_HOME)"
            )
        stop(home)
    eh.mkdir(parents=True, exist_ok=True)
    secret = api_key(eh, key)
    cmd = [sys.executable, "-m", "tgnb.emulator.cli", "serve", "--home", str(eh.parent)]
    cmd += options.to_argv()
    log = eh / "emulator.log"
    shell = f"{shlex.join(cmd)} >>{shlex.quote(str(log))} 2>&1 </dev/null &"
    env = dict(os.environ, **{KEY_ENV: secret})
    env.pop("TGNB_HOME", None)
    # The daemon never needs the user's real credentials: keep them out of its environment.
    for name in ("TOGETHER_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        env.pop(name, None)
    subprocess.run(["/bin/sh", "-c", shell], env=env, check=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(home)
        if st.running:
            return st, True
        time.sleep(0.1)
    tail = log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.exists() else ""
    raise EmulatorError(
        f"the emulator did not come up within {timeout:.0f}s; see {log}. Last output:\n{tail}"
    )


def after_crash(eh: Path, options: ServeOptions, asked: Iterable[str] | None) -> ServeOptions:
    """`options` completed with what the crashed daemon of `eh` ran with: the recorded value of
    every option not in `asked` (None: all were asked), and the recorded port when no port is asked
    (0) and it is free. Unchanged when no daemon crashed there (a clean stop removes its record)."""
    info = _read_server(eh)
    had = (info or {}).get("options")
    if not isinstance(had, dict) or _alive(int((info or {}).get("pid") or 0)):
        return options
    flat = options.flat()
    given = set(flat) if asked is None else set(asked)
    for name, value in had.items():
        if name in flat and name != "port" and name not in given:
            flat[name] = value
    port = (info or {}).get("port")
    if not flat["port"] and isinstance(port, int) and _port_free(port):
        flat["port"] = port
    try:
        return ServeOptions.of(**flat)
    except (TypeError, ValueError):  # a record from another version: start as asked
        return options


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def stop(home: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the daemon of this home (SIGTERM, then SIGKILL). False when none was running."""
    eh = emulator_home(home)
    info = _read_server(eh)
    if not info:
        return False
    pid = int(info.get("pid", 0))
    if not pid or not _alive(pid) or not _is_emulator(pid) or not _serves(pid, eh):
        (eh / "server.json").unlink(missing_ok=True)  # stale, or naming another home's server
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
    (eh / "server.json").unlink(missing_ok=True)
    return True


def _is_emulator(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"tgnb.emulator" in fh.read()
    except FileNotFoundError:
        return True  # no /proc (macOS): trust server.json


def _serves(pid: int, eh: Path, *, probe: bool = True) -> bool:
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
def _home_lock(eh: Path) -> Iterator[None]:
    eh.mkdir(parents=True, exist_ok=True)
    fh = open(eh / "lock", "a+")  # noqa: SIM115
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read_server(eh) or {}
            raise EmulatorError(
                f"an emulator already runs for {eh} (pid {info.get('pid', '?')}); "
                "stop it with 'tgnb emulator stop' or use another TGNB_HOME"
            ) from None
        yield
    finally:
        fh.close()


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _rl_platform(options: ServeOptions, fleet: Any, state_dir: Path) -> Any:
    """The Post-Training side: its records under ``state/rl``, GPUs under the fleet's cap."""
    from tgnb.emulator.rl.lifecycle import Platform, RLConfig
    from tgnb.emulator.rl.state import RLStore

    price = options.rl_price_per_gpu_hour
    if price is None:
        price = float(os.environ.get(RL_PRICE_ENV) or 9.0)
    extra = tuple(p for p in (options.rl_models or "").split(os.pathsep) if p)
    platform = Platform(
        RLConfig(
            time_scale=fleet.config.time_scale,
            provision_delay_s=fleet.config.provision_delay_s,
            price_per_gpu_hour=price,
            project_id=fleet.config.default_project_id,
            extra_models=extra,
        ),
        RLStore(state_dir / "rl"),
        capacity_left=fleet.capacity_left_for_others,
    )
    fleet.external_gpus = lambda: platform.held_gpus
    return platform


def serve(
    home: Path | None = None, options: ServeOptions | None = None, key: str | None = None
) -> int:
    """Run the emulator in the foreground until SIGINT/SIGTERM."""
    import uvicorn

    from tgnb.emulator.app import Chaos, EmulatorApp
    from tgnb.emulator.fleet import Fleet
    from tgnb.emulator.store import StateStore

    options = (options or ServeOptions()).check()  # before the lock is taken
    eh = emulator_home(home)
    with _home_lock(eh):
        secret = api_key(eh, key)
        fleet = Fleet(replace(options.fleet), StateStore(eh / "state"))
        if options.fleet.capacity_gpus is not None:  # over the cap a restarted state kept
            fleet.config.capacity_gpus = options.fleet.capacity_gpus
        trace = options.trace()
        if trace is not None:  # the same trace a restarted state kept goes on where it was
            fleet.install_trace(trace, keep_same=True)
        chaos = Chaos(
            fraction=options.chaos, seed=options.chaos_seed, delay_s=options.chaos_delay_s
        )
        rl = _rl_platform(options, fleet, eh / "state")
        app = EmulatorApp(fleet, secret, chaos, rl=rl).build()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without, a response written in two parts (headers,
        # body) waits for the client's delayed ACK, 40 ms per request on a kept-alive connection
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((HOST, options.port))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, timeout_graceful_shutdown=2
        )
        server = uvicorn.Server(config)
        fleet.start()
        rl.start()
        atomic_write_json(
            eh / "server.json",
            {
                "pid": os.getpid(),
                "host": HOST,
                "port": port,
                "started_at": time.time(),
                "options": options.flat(),
                "owner": _owner(),
            },
        )
        print(f"tgnb emulator: serving http://{HOST}:{port} (pid {os.getpid()})", flush=True)
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal with the
        # handlers it found: make those a clean exit, so the cleanup below runs and the status is 0.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _exit_cleanly)
        try:
            server.run(sockets=[sock])
        finally:
            rl.stop()
            fleet.stop()
            info = _read_server(eh)
            if info and info.get("pid") == os.getpid():
                (eh / "server.json").unlink(missing_ok=True)
        return 0
