"""The sidebar shows a fault-tolerant run's replica groups (issue 50 §2) in a real JupyterLab, in
headless Chromium: under the run, the line for its groups, the group that left on a preemption
notice and its replacement, healed from the survivor at its step: the lines `Run.summary` gives
(`tgnb.runs.replicas`), as the server sends them (``IRun.groups``).

Real parts: JupyterLab and the tgnb server extension, the labextension as installed, Chromium
(Debian's package) driven by Playwright, the emulator daemon, a plain TorchFT program (two replica
groups of gloo under the real lighthouse) on its local engine, one group's node preempted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator import daemon
from tgnb.events import GROUP_JOINED
from tgnb.server.serialize import run_json

pytestmark = pytest.mark.slow
pytest.importorskip("torchft")

#: Seconds the page may take to show a change.
SEES = 120


@pytest.mark.timeout(900)
def test_the_sidebar_shows_who_left_joined_and_healed(
    browser: Any, lab: Any, artifacts: Path, tmp_path: Path
) -> None:
    from tests.backends.local.test_replica_groups import check_healed, launch, of
    from tgnb.session import attach

    session = attach(local=True, home=lab.home)
    assert session.scale(preemptible=16, wait=True, timeout=120, poll=0.2)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    run = None
    try:
        page.goto(f"{lab.url}/lab?token={lab.token}")
        tab = page.locator(".jp-SideBar .lm-TabBar-tab[data-id='tgnb-sidebar']")
        tab.wait_for(timeout=90_000)
        tab.click()
        until = tmp_path / "until"
        run = launch(session, "ft-sidebar", until)
        joined = {e["data"]["group"]: e["node"] for e in of(run, GROUP_JOINED)}
        session.preempt(joined[0])
        check_healed(run, lost=0, until=until)  # the run has ended
        want = run_json(run)["groups"]
        assert len(want) == 3 and "healed from group 1 at step " in want[2], want
        item = page.locator("#tgnb-sidebar li[data-run='ft-sidebar']")

        def shown() -> tuple[str, list[str]]:  # (its badge, its group lines), as rendered now
            lines = item.locator("[data-testid=tgnb-run-groups]").all_inner_texts()
            return str(item.locator(".tgnb-badge").inner_text()), [str(t) for t in lines]

        # once it shows the run ended the sidebar renders it no more (each change re-renders it)
        wait_until(lambda: shown() == ("succeeded", want), SEES, what=f"the group lines {want}")
        page.screenshot(path=str(artifacts / "groups-healed.png"))
    except BaseException:
        page.screenshot(path=str(artifacts / "groups-failed.png"), full_page=True)
        raise
    finally:
        page.close()
        if run is not None and not run.refresh().state.finished:
            run.stop()
        daemon.stop(lab.home)
