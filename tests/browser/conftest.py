"""A real JupyterLab on loopback and headless Chromium (Debian's package) driven by Playwright.

`lab` starts JupyterLab on 127.0.0.1 (a free port, token auth) in a temporary root folder with its own
config, runtime, settings and workspace folders and a temporary tgnb home; `browser` launches
``/usr/bin/chromium`` through Playwright's ``executable_path`` (Playwright's own browser download is
never used). Both are stopped at the end, and so are the emulator daemon and any run the notebook
started under the tgnb home.

When Chromium or Playwright is missing the tests are skipped with the reason, except in CI
(``CI=true``), where they fail: run ``.ci/browser-up`` first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tgnb.session import shutdown_local

CHROMIUM = os.environ.get("TGNB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _missing(what: str) -> None:
    message = f"{what}: run .ci/browser-up (Debian's chromium package and pip's playwright)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots go: ``$TGNB_ARTIFACTS/browser`` or ``tests/browser/artifacts``."""
    base = os.environ.get("TGNB_ARTIFACTS")
    folder = Path(base) / "browser" if base else Path(__file__).parent / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        _missing(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Lab:
    """A running JupyterLab: its URL and token, root folder, tgnb home and server log."""

    url: str
    token: str
    root: Path
    home: Path
    log: Path

    def open_url(self, path: str) -> str:
        return f"{self.url}/lab/tree/{path}?token={self.token}"


def _quiet_settings(settings: Path) -> None:
    """No news or update checks (no network here) and no pop-ups over the notebook."""
    ext = settings / "@jupyterlab" / "apputils-extension"
    ext.mkdir(parents=True, exist_ok=True)
    (ext / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    nb = settings / "@jupyterlab" / "notebook-extension"
    nb.mkdir(parents=True, exist_ok=True)  # every cell in the DOM, whatever the viewport
    (nb / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1, its kernels seeing a temporary ``TGNB_HOME``."""
    if shutil.which("jupyter-lab") is None and not _has_module("jupyterlab"):
        _missing("jupyterlab is not installed")
    base = tmp_path_factory.mktemp("lab")
    root, home, jupyter = base / "root", base / "tgnb-home", base / "jupyter"
    for d in (root, home, jupyter / "config", jupyter / "runtime", jupyter / "workspaces"):
        d.mkdir(parents=True)
    _quiet_settings(jupyter / "settings")
    port, token = _free_port(), os.urandom(16).hex()
    env = dict(os.environ)
    for var in ("TOGETHER_API_KEY", "TOGETHER_BASE_URL", "TOGETHER_PROJECT_ID"):
        env.pop(var, None)
    env.update(
        TGNB_HOME=str(home),
        HF_HUB_OFFLINE="1",
        JUPYTER_CONFIG_DIR=str(jupyter / "config"),
        JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(jupyter / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(jupyter / "workspaces"),
    )
    log = base / "jupyterlab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
    ]
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Lab(f"http://127.0.0.1:{port}", token, root, home, log)
    try:
        _wait_ready(server, proc)
        yield server
    finally:
        _stop(proc)
        shutdown_local(home)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _wait_ready(server: Lab, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            r = httpx.get(f"{server.url}/api/status", params={"token": server.token}, timeout=2)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    tail = server.log.read_text(errors="replace")[-3000:]
    pytest.fail(f"JupyterLab did not come up on {server.url}; its log:\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM: the server shuts its kernels down and exits; SIGKILL to its group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
