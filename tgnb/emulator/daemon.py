"""Run the emulator: in the foreground (`serve`) or as a detached daemon (`start`, `stop`, `status`).

Its files live in the emulator home (`tgnb.emulator.home`: ``server.json``, ``api_key``, ``lock``,
``emulator.log``, ``state/``); the options it runs with, their ranges, the mismatch with a running
one and what a crashed one had are `tgnb.emulator.options` (both re-exported here, where the rest
of tgnb imports them).

`start` launches ``serve`` in a new session through a shell that exits at once, so the daemon is
nobody's child: it keeps running after the starting process (a test, a Jupyter kernel) exits.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from tgnb.config import Secret
from tgnb.emulator.admin import AdminClient
from tgnb.emulator.home import (
    HOST,
    KEY_ENV,
    OWNER_ENV,
    EmulatorStatus,
    alive,
    api_key,
    current_owner,
    emulator_home,
    home_lock,
    is_emulator,
    read_server,
    saved_key,
    serves,
)
from tgnb.emulator.options import (
    FLEET_KNOBS,
    OPTION_RANGES,
    ServeOptions,
    after_crash,
    check_options,
    differences,
)
from tgnb.emulator.store import atomic_write_json
from tgnb.errors import EmulatorError, EmulatorMismatchError

__all__ = [
    "FLEET_KNOBS",
    "HOST",
    "KEY_ENV",
    "OPTION_RANGES",
    "OWNER_ENV",
    "RL_PRICE_ENV",
    "EmulatorStatus",
    "ServeOptions",
    "after_crash",
    "api_key",
    "check_options",
    "differences",
    "emulator_home",
    "owned",
    "serve",
    "start",
    "status",
    "stop",
]

RL_PRICE_ENV = "TGNB_EMULATOR_RL_PRICE"  # $ per GPU-hour of Post-Training resources (default 9)


def status(home: Path | None = None, timeout: float = 3.0) -> EmulatorStatus:
    """Is an emulator running for this tgnb home? Checks the pid and asks its health endpoint."""
    eh = emulator_home(home)
    info = read_server(eh)
    pid = int(info.get("pid", 0)) if info else 0
    if not info or not alive(pid) or not serves(pid, eh, probe=False):
        return EmulatorStatus(running=False, home=eh)  # none, or another home's server
    key = saved_key(eh)
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


def owned(st: EmulatorStatus) -> bool:
    """Did the current command start this emulator (the same ``$TGNB_EMULATOR_OWNER``)?"""
    return st.owner is not None and st.owner == current_owner()


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


def stop(home: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the daemon of this home (SIGTERM, then SIGKILL). False when none was running."""
    eh = emulator_home(home)
    info = read_server(eh)
    if not info:
        return False
    pid = int(info.get("pid", 0))
    if not pid or not alive(pid) or not is_emulator(pid) or not serves(pid, eh):
        (eh / "server.json").unlink(missing_ok=True)  # stale, or naming another home's server
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)
    (eh / "server.json").unlink(missing_ok=True)
    return True


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
            idle_scale=options.rl_idle_scale,
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
    with home_lock(eh):
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
                "owner": current_owner(),
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
            info = read_server(eh)
            if info and info.get("pid") == os.getpid():
                (eh / "server.json").unlink(missing_ok=True)
        return 0
