"""The sidebar names a Post-Training resource left billing by a process that is gone, as a
researcher sees it in a real JupyterLab in headless Chromium: a script started a model resource
with ``tgnb.post_training()`` and was SIGKILLed (no handler, no exit hook); the sidebar lists the
resource with what it has cost (the emulator's bill) and the command that stops it; once
``tgnb pt stop --leftovers`` ran, the list is gone. Real browser, real Lab, real emulator and
real processes; nothing of tgnb is faked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import Lab

pytestmark = pytest.mark.slow

STARTS_AND_DIES = """\
import os, signal
import tgnb
res = tgnb.post_training().start("tgnb/tiny-llama", generators=0)
print(res.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _env(lab: Lab) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGNB_", "TOGETHER_"))}
    env.update(TGNB_HOME=str(lab.home), HF_HUB_OFFLINE="1", TOGETHER_DISABLE_VERSION_CHECK="1")
    return env


def test_the_sidebar_names_a_leftover_and_its_cost_until_it_is_stopped(
    lab: Lab, browser_page: Any, artifacts: Path, tmp_path: Path
) -> None:
    page = browser_page
    shot = lambda name: page.screenshot(path=str(artifacts / f"leftovers-{name}.png"))  # noqa: E731
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "start.py").write_text(STARTS_AND_DIES, encoding="utf-8")
    done = subprocess.run([sys.executable, "start.py"], cwd=folder, env=_env(lab),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == -9, done.stderr[-2000:]
    rid = done.stdout.strip().splitlines()[-1]
    try:
        page.goto(f"{lab.url}lab?token={lab.token}")
        page.locator('.jp-SideBar [data-id="tgnb-sidebar"]').click()
        sidebar = page.locator("#tgnb-sidebar")
        item = sidebar.locator(f'.tgnb-leftover[data-resource="{rid}"]')
        item.wait_for(timeout=60_000)
        box = sidebar.locator('[data-testid="tgnb-leftovers"]').inner_text()
        assert "Left running: 1 Post-Training resource(s)" in box, box
        assert "$" in box and "so far (the emulator's bill)" in box, box
        assert "stop them: tgnb pt stop --leftovers" in box, box
        assert "pid" in (item.get_attribute("title") or ""), item.get_attribute("title")
        shot("01-listed")

        stopped = subprocess.run(["tgnb", "pt", "stop", "--leftovers"], env=_env(lab),
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
        assert stopped.returncode == 0 and rid in stopped.stdout, (stopped.stdout, stopped.stderr)
        item.wait_for(state="detached", timeout=60_000)  # the sidebar's next look
        assert sidebar.locator('[data-testid="tgnb-leftovers"]').inner_text().strip() == ""
        shot("02-stopped")
    except Exception:
        shot("failure")
        log = lab.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"browser test failed; JupyterLab log tail:\n{log}") from None
