"""Fixtures of the browser tests: a real emulator daemon, JupyterLab (with the built tgnb
extension and the tgnb server extension) on 127.0.0.1 with a temporary root and TGNB_HOME, and
Debian's Chromium driven by Playwright. Screenshots go to ``out/lab/`` (git-ignored) or to
``$TGNB_LAB_ARTIFACTS``.

A missing built extension fails these tests (the README's ``pip install -e '.[all]'`` builds it);
outside CI a missing Chromium or Playwright skips them, with ``CI=true`` it fails them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tgnb.emulator.testing import EmulatorHandle, free_port, running_emulator

REPO = Path(__file__).resolve().parents[2]
LABEXTENSION = REPO / "tgnb" / "labextension"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing(reason: str) -> None:
    """Fail under CI, skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("TGNB_LAB_ARTIFACTS") or REPO / "out" / "lab")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser_page(artifacts: Path) -> Iterator[Any]:
    """A Playwright page in headless Debian Chromium (never a downloaded browser)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed: pip install playwright")
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} not found: apt-get install -y --no-install-recommends chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


@dataclass
class Lab:
    url: str  # http://127.0.0.1:PORT/
    token: str
    home: Path
    emulator: EmulatorHandle
    log: Path


def _write_lab_settings(settings_dir: Path) -> None:
    """No news or update-check toasts: only tgnb's notifications appear in the test."""
    path = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab with tgnb on a free loopback port; its Session attaches to the emulator."""
    if not (LABEXTENSION / "package.json").exists():
        pytest.fail(
            "the labextension is not built: `pip install -e '.[all]'` builds it (Node.js >= 18 "
            "and npm on the PATH), or run .ci/extension-build"
        )
    home = tmp_path / "tgnb-home"
    root = tmp_path / "root"
    labext = tmp_path / "labextensions"
    for d in (home, root, labext):
        d.mkdir()
    (labext / "tgnb").symlink_to(LABEXTENSION)  # the build of this checkout, first on the path
    _write_lab_settings(tmp_path / "lab-settings")
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"tgnb.server": True}},
                "TgnbServer": {"poll_interval": 0.5},
            }
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TOGETHER_API_KEY", "TOGETHER_BASE_URL", "TOGETHER_PROJECT_ID")
    }
    env.update(
        TGNB_HOME=str(home),
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
    )
    port, token = free_port(), secrets.token_hex(16)
    log = tmp_path / "lab.log"
    with running_emulator(home, time_scale=0.01) as emu, open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                f"--LabApp.extra_labextensions_path={labext}",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    r = httpx.get(f"{url}api/status", params={"token": token}, timeout=2)
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + log.read_text()[-3000:])
                time.sleep(0.3)
            yield Lab(url, token, home, emu, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    shutil.rmtree(labext, ignore_errors=True)
