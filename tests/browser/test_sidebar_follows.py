"""The Together sidebar follows the emulator in a real JupyterLab, in headless Chromium: opened
before any emulator runs it says so and offers Attach; `tgnb emulator start` in a terminal is found
within seconds and without a reload; a stop shows the disconnected state with its Attach button,
which starts the emulator (at the time scale `%tg attach --local` uses); a stop and a start on
another port are followed again, and the sidebar's scale control reaches the new emulator.

Real parts: JupyterLab and the tgnb server extension, the labextension as installed, Chromium
(Debian's package) driven by Playwright, emulator daemons started by the `tgnb emulator` command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import together

from tests.conftest import wait_until
from tgnb.config import DEFAULT_TIME_SCALE
from tgnb.emulator import daemon
from tgnb.emulator.testing import free_port

pytestmark = pytest.mark.slow

#: Seconds the sidebar may take to see a change (it reads every 2 s; the server polls each 1 s).
SEES = 60


def tgnb_emulator(lab: Any, *args: str) -> str:
    """Run ``tgnb emulator ARGS`` for the lab's tgnb home, as a person in a terminal would."""
    env = {**os.environ, "TGNB_HOME": str(lab.home)}
    env.pop(daemon.OWNER_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "emulator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _text(page: Any, testid: str) -> str:
    node = page.locator(f"#tgnb-sidebar [data-testid={testid}]")
    return str(node.inner_text()) if node.count() else ""


def _attached(page: Any) -> bool:
    return "tgnb-demo" in _text(page, "tgnb-cluster")


def _detached(page: Any) -> bool:
    return _text(page, "tgnb-detached") != "" and page.locator("#tgnb-sidebar .tgnb-attach").count()


def test_sidebar_follows_start_stop_and_restart_on_another_port(
    browser: Any, lab: Any, artifacts: Path
) -> None:
    assert not daemon.status(lab.home).running
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab.url}/lab?token={lab.token}")
        tab = page.locator(".jp-SideBar .lm-TabBar-tab[data-id='tgnb-sidebar']")
        tab.wait_for(timeout=90_000)
        tab.click()
        # opened with no emulator: it says so, names the fix, offers Attach, starts nothing
        wait_until(lambda: _detached(page), SEES, what="the sidebar's not-attached state")
        assert _text(page, "tgnb-detached") == "not attached yet"
        wait_until(
            lambda: (
                "tgnb emulator start" in (_text(page, "tgnb-cluster") + _text(page, "tgnb-error"))
            ),
            SEES,
            what="the fix",
        )
        page.screenshot(path=str(artifacts / "sidebar-1-no-emulator.png"))
        assert not daemon.status(lab.home).running

        # an emulator started in a terminal after the page opened: found, no reload
        first = free_port()
        tgnb_emulator(lab, "start", "--port", str(first))
        wait_until(lambda: _attached(page), SEES, what="the sidebar to find the emulator")
        # the panel's parts are redrawn one after another: wait for each (a loaded CI machine
        # saw the cluster's name before the old error line was cleared)
        wait_until(
            lambda: _text(page, "tgnb-error") == "",
            SEES,
            what="the old error line to go",
        )
        wait_until(
            lambda: "allocated 0 / desired 0" in _text(page, "tgnb-capacity"),
            SEES,
            what="the capacity line",
        )
        page.screenshot(path=str(artifacts / "sidebar-2-found.png"))

        # stopped: the disconnected state, with Attach
        tgnb_emulator(lab, "stop")
        wait_until(lambda: _detached(page), SEES, what="the disconnected state")
        wait_until(
            lambda: _text(page, "tgnb-detached") == "disconnected", SEES, what="disconnected"
        )
        wait_until(lambda: _text(page, "tgnb-capacity") == "", SEES, what="no stale numbers")
        page.screenshot(path=str(artifacts / "sidebar-3-disconnected.png"))

        # Attach starts the emulator, at the time scale `%tg attach --local` uses
        page.locator("#tgnb-sidebar .tgnb-attach").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        wait_until(lambda: _attached(page), SEES, what="Attach to start the emulator")
        st = daemon.status(lab.home)
        assert st.running and st.options and st.options["time_scale"] == DEFAULT_TIME_SCALE

        # stopped, then started again on another port: followed
        tgnb_emulator(lab, "stop")
        wait_until(lambda: _detached(page), SEES, what="the disconnected state")
        second = free_port()
        tgnb_emulator(lab, "start", "--port", str(second))
        wait_until(lambda: _attached(page), SEES, what="the sidebar to find the moved emulator")
        page.screenshot(path=str(artifacts / "sidebar-4-moved.png"))

        # the sidebar's scale control reaches the emulator on the new port
        page.locator("#tgnb-sidebar [data-testid=tgnb-scale-up]").click()
        page.locator("#tgnb-sidebar [data-testid=tgnb-scale-apply]").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        st = daemon.status(lab.home)
        assert st.base_url and st.base_url.endswith(f":{second}") and st.api_key
        client = together.Together(base_url=st.base_url, api_key=st.api_key.get())
        try:

            def target() -> int:
                clusters = client.clusters.list().clusters
                return sum(int(c.desired_preemptible_gpus or 0) for c in clusters)

            wait_until(lambda: target() == 8, SEES, what="the new emulator's target to be 8")
        finally:
            client.close()
        wait_until(
            lambda: "desired 8" in _text(page, "tgnb-capacity"), SEES, what="the sidebar to show it"
        )
    except BaseException:
        page.screenshot(path=str(artifacts / "sidebar-failed.png"), full_page=True)
        raise
    finally:
        page.close()
        daemon.stop(lab.home)
