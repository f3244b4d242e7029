"""The Together sidebar in a real JupyterLab in headless Chromium: it renders the attached cluster,
scaling from it (through its confirmation dialog) changes the emulator's target, and a preemption
on the emulator raises a notification. Real browser, real Lab, real emulator over loopback HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import together

from .conftest import Lab

pytestmark = pytest.mark.slow


def target_and_id(lab: Lab) -> tuple[int, str]:
    """(preemptible target, id) of the demo cluster, read from the emulator with the SDK."""
    client = together.Together(base_url=lab.emulator.base_url, api_key=lab.emulator.api_key)
    try:
        (cluster,) = [c for c in client.clusters.list().clusters if c.cluster_name == "tgnb-demo"]
        return int(cluster.desired_preemptible_gpus or 0), cluster.cluster_id
    finally:
        client.close()


def test_sidebar_renders_scales_and_notifies_preemption(
    lab: Lab, browser_page: Any, artifacts: Path
) -> None:
    page = browser_page
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
        lab.emulator.wait_for(lambda: target_and_id(lab)[0] == 16, timeout=30)
        page.locator('#tgnb-sidebar .tgnb-capacity-text[data-allocated="16"]').wait_for()
        shot("03-scaled")

        _, cluster_id = target_and_id(lab)
        node = lab.emulator.preempt(cluster_id)
        toast = page.locator(".Toastify__toast", has_text="Preemption notice")
        toast.first.wait_for()
        assert node["name"] in toast.first.inner_text()
        sidebar.locator(".tgnb-reason-TogetherPreemptionNotified").first.wait_for()
        shot("04-preemption-toast")

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
        shot("05-palette")
    except Exception:
        shot("failure")
        log = lab.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"browser test failed; JupyterLab log tail:\n{log}") from None
