"""The sidebar's states as a newcomer meets them, in a real JupyterLab in headless Chromium: opened
before any emulator runs (the normal first state: neutral, not an error), attached once one starts,
and after the emulator stops (one message for the one cause). While no cluster is attached the
Attach button looks like a button one can press and the scale control is disabled; attached, the
scale control is enabled. Real browser, real Lab, real emulator daemon started and stopped."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator import daemon

from .conftest import Lab

pytestmark = pytest.mark.slow

SCALE = ["tgnb-scale-down", "tgnb-scale-up", "tgnb-scale-apply"]


def _disabled(sidebar: Any) -> list[bool]:
    return [sidebar.locator(f'[data-testid="{t}"]').is_disabled() for t in SCALE]


def _messages(sidebar: Any) -> list[str]:
    """Every line of text the sidebar shows about its cluster's state (status, reason, error)."""
    found = sidebar.locator(
        '[data-testid="tgnb-cluster"] .tgnb-muted, [data-testid="tgnb-error"]'
    ).all_inner_texts()
    return [t.strip() for t in found if t.strip()]


def _looks_pressable(button: Any) -> None:
    assert button.is_enabled()
    style = button.evaluate(
        "b => { const s = getComputedStyle(b); return [s.opacity, s.backgroundColor, s.cursor] }"
    )
    opacity, background, cursor = style
    assert float(opacity) == 1.0, style
    # a filled, coloured button: not transparent, not a grey (r == g == b)
    rgb = [int(x) for x in re.findall(r"\d+", background)[:3]]
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), style
    assert len(set(rgb)) > 1, style
    assert cursor == "pointer", style


def test_first_open_attach_and_stop_read_as_states_not_errors(
    lab: Lab, browser_page: Any, artifacts: Path
) -> None:
    page = browser_page
    shot = lambda name: page.screenshot(path=str(artifacts / f"states-{name}.png"))  # noqa: E731
    key = lab.emulator.api_key
    daemon.stop(lab.home)
    try:
        page.goto(f"{lab.url}lab?token={lab.token}")
        page.locator('.jp-SideBar [data-id="tgnb-sidebar"]').click()
        sidebar = page.locator("#tgnb-sidebar")
        attach = sidebar.locator('[data-testid="tgnb-attach"]')
        attach.wait_for()
        # where the README says the icon is: in the left sidebar, the last of JupyterLab's own
        # panels' icons above it, the extension manager's below it
        tabs = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab").evaluate_all(
            "l => l.map(e => e.dataset.id)"
        )
        assert tabs.index("tgnb-sidebar") == len(tabs) - 2, tabs
        assert tabs[-1] == "extensionmanager.main-view", tabs
        page.wait_for_timeout(3000)  # the first read and one retry have answered
        shot("01-first-open")
        assert sidebar.locator('[data-testid="tgnb-error"]').inner_text().strip() == ""
        said = _messages(sidebar)
        assert said[0] == "not attached yet", said
        assert len(said) <= 2, said
        _looks_pressable(attach)
        assert _disabled(sidebar) == [True, True, True]

        daemon.start(lab.home, daemon.ServeOptions.of(time_scale=0.01), key)
        sidebar.locator(".tgnb-cluster-name").wait_for(timeout=30_000)
        assert _disabled(sidebar) == [False, False, False]
        shot("02-attached")

        daemon.stop(lab.home)
        sidebar.locator('[data-testid="tgnb-detached"]').wait_for(timeout=30_000)
        page.wait_for_timeout(5000)  # the browser's retries (every 2 s) have answered too
        shot("03-stopped")
        said = _messages(sidebar)
        assert said[0] == "disconnected", said
        assert len(said) == 2, said  # the state and its one cause
        assert sidebar.locator('[data-testid="tgnb-error"]').inner_text().strip() == ""
        assert _disabled(sidebar) == [True, True, True]
        _looks_pressable(sidebar.locator('[data-testid="tgnb-attach"]'))
    except Exception as exc:
        shot("failure")
        log = lab.log.read_text(errors="replace")[-2000:]
        raise AssertionError(f"{exc}\nJupyterLab log tail:\n{log}") from None
