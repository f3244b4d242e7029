"""The Together sidebar in a real JupyterLab in headless Chromium: it renders the attached cluster,
scaling from it (through its confirmation dialog) changes the emulator's target, a preemption on
the emulator raises a notification, the run on the preempted node is listed and its resume raises
another, and the palette has the Together commands. Real browser, real Lab, real emulator over
loopback HTTP; the run uses the local engine tests' stand-in trainer instead of TRL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import together

from tests.conftest import wait_until

from .conftest import REPO, Lab

STANDIN_DIR = REPO / "tests" / "backends" / "local"

pytestmark = pytest.mark.slow


def target_and_id(lab: Lab) -> tuple[int, str]:
    """(preemptible target, id) of the demo cluster, read from the emulator with the SDK."""
    client = together.Together(base_url=lab.emulator.base_url, api_key=lab.emulator.api_key)
    try:
        (cluster,) = [c for c in client.clusters.list().clusters if c.cluster_name == "tgnb-demo"]
        return int(cluster.desired_preemptible_gpus or 0), cluster.cluster_id
    finally:
        client.close()


def launch_standin(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Launch a long run on the demo cluster with the local engine tests' stand-in trainer."""
    from tgnb.session import attach

    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
    session = attach(local=True, home=lab.home)
    return session.launch("grpo", name="lab-run", max_steps=600)


def test_sidebar_renders_scales_and_notifies_preemption(
    lab: Lab, browser_page: Any, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = browser_page
    runs: list[Any] = []
    shot = lambda name: page.screenshot(path=str(artifacts / f"{name}.png"))  # noqa: E731
    try:
        page.goto(f"{lab.url}lab?token={lab.token}")
        tab = page.locator('.jp-SideBar [data-id="tgnb-sidebar"]')
        tab.wait_for()
        assert lab.emulator.requests() == [], "opening JupyterLab alone must not attach"
        tab.click()
        sidebar = page.locator("#tgnb-sidebar")
        sidebar.locator(".tgnb-cluster-name", has_text="tgnb-demo").wait_for()
        capacity = sidebar.locator(".tgnb-capacity-text")
        assert capacity.get_attribute("data-desired") == "0"
        shot("01-sidebar")

        sidebar.locator('[data-testid="tgnb-scale-up"]').click()
        sidebar.locator('[data-testid="tgnb-scale-up"]').click()
        assert sidebar.locator('[data-testid="tgnb-scale-value"]').inner_text() == "16"
        sidebar.locator('[data-testid="tgnb-scale-apply"]').click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for()
        assert "from 0 to 16 GPUs" in dialog.inner_text()
        shot("02-confirm-scale")
        assert target_and_id(lab)[0] == 0, "nothing is sent before the confirmation"
        dialog.locator("button.jp-mod-accept").click()
        wait_until(lambda: target_and_id(lab)[0] == 16, timeout=30)
        page.locator('#tgnb-sidebar .tgnb-capacity-text[data-allocated="16"]').wait_for()
        shot("03-scaled")

        # a run (the local engine tests' stand-in trainer) on a preemptible node, then its node is
        # preempted: a preemption toast, then a "resumed" toast when it restarts elsewhere
        run = launch_standin(lab, monkeypatch)
        runs.append(run)
        wait_until(lambda: run.records("metrics") and run.status.nodes, timeout=60)
        node = run.status.nodes[0]
        sidebar.locator('.tgnb-run[data-run="lab-run"]').wait_for()
        _, cluster_id = target_and_id(lab)
        lab.emulator.preempt(cluster_id, node)
        toast = page.locator(".Toastify__toast", has_text="Preemption notice")
        toast.first.wait_for()
        assert node in toast.first.inner_text()
        sidebar.locator(".tgnb-reason-TogetherPreemptionNotified").first.wait_for()
        shot("04-preemption-toast")
        page.locator(".Toastify__toast", has_text="Run lab-run resumed").first.wait_for(
            timeout=90_000
        )
        page.locator('#tgnb-sidebar .tgnb-run[data-run="lab-run"] .tgnb-badge').wait_for()
        page.wait_for_timeout(800)  # let the toast finish sliding in before the screenshot
        shot("05-run-resumed")

        page.keyboard.press("Control+Shift+C")
        palette = page.locator(".lm-CommandPalette")
        palette.locator("input").fill("Together")
        items = palette.locator(".lm-CommandPalette-item:visible").all_inner_texts()
        for label in (
            "Together: attach to a cluster",
            "Together: scale preemptible GPUs",
            "Together: open a run's timeline",
        ):
            assert any(label in item for item in items), items
        shot("06-palette")
    except Exception:
        shot("failure")
        log = lab.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"browser test failed; JupyterLab log tail:\n{log}") from None
    finally:
        for run in runs:
            run.stop()
            run.wait(timeout=60)
