"""A model resource started with ``tgnb.post_training()`` by a process that is then killed
(SIGKILL: no handler, no exit hook) is in the tgnb home's registry; the next process sees it: its
``.cost()`` from the service's timestamps (not from when that process first looked: it read $0.00),
``%tg pt resources`` marks it, ``%tg cost`` names it, and ``%tg pt stop --leftovers`` stops it.
The real emulator daemon over loopback HTTP and a real subprocess; nothing of tgnb is faked."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle

STARTS_AND_DIES = """\
import os, signal
import tgnb
res = tgnb.post_training().start("tgnb/tiny-llama", generators=0)
print(res.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def emu(rl_emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> EmulatorHandle:
    monkeypatch.setenv("TGNB_HOME", str(rl_emulator.home))
    return rl_emulator


@pytest.fixture
def pt(ip: Any) -> Any:
    magics = ip.magics_manager.registry["Tg"]
    magics._pt = None
    yield magics
    magics._pt = None


def left_by_a_killed_process(emu: EmulatorHandle, folder: Path) -> str:
    folder.mkdir()
    (folder / "start.py").write_text(STARTS_AND_DIES, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env.update(emu.env, HF_HUB_OFFLINE="1", TOGETHER_DISABLE_VERSION_CHECK="1")
    done = subprocess.run(
        [sys.executable, "start.py"], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr
    rid = done.stdout.strip().splitlines()[-1]
    entries = [
        json.loads(p.read_text()) for p in (emu.home / "posttraining" / "resources").glob("*.json")
    ]
    assert [e for e in entries if e["resource_id"] == rid and e["by"] == "tgnb.posttraining"]
    return rid


def test_a_leftovers_cost_comes_from_the_service(
    emu: EmulatorHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the service path (``local=False``: no usage report), what the resource has cost runs
    from the service's READY time, read by its creator: close to the price times the time since
    the emulator's own READY (real time here: the service path has no time scale)."""
    from tgnb.posttraining import post_training

    rid = left_by_a_killed_process(emu, tmp_path / "project")
    time.sleep(2.0)
    monkeypatch.setenv("TOGETHER_API_KEY", emu.api_key)
    monkeypatch.setenv("TOGETHER_BASE_URL", emu.base_url)
    service = post_training(local=False)
    assert service.conn.emulator is None
    cost = service.attach(rid).cost()
    ready = datetime.fromisoformat(emu.rl_usage(rid)["ready_at"].replace("Z", "+00:00"))
    hours = (datetime.now(timezone.utc) - ready).total_seconds() / 3600
    assert cost.amount == pytest.approx(cost.price_per_hour * hours, rel=0.15)
    assert cost.amount > 0
    assert [x.resource_id for x in service.leftovers()] == [rid]
    assert service.stop_leftovers() == [(rid, "STOPPED")]
    assert service.leftovers() == []


def test_magics_name_and_stop_leftovers(
    ip: Any, pt: Any, emu: EmulatorHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rid = left_by_a_killed_process(emu, tmp_path / "project")
    table = ip.run_line_magic("tg", "pt resources")
    (row,) = [r for r in table.rows if r[0] == rid]
    assert row[2] == "READY (leftover)"
    assert "tgnb pt stop --leftovers stops them" in table.caption
    capsys.readouterr()
    with contextlib.suppress(Exception):  # no cluster attached: the leftovers are said first
        ip.run_line_magic("tg", "cost")
    said = capsys.readouterr().out
    assert rid in said and "so far (the emulator's bill)" in said, said
    ip.run_line_magic("tg", "pt stop --leftovers")
    assert f"model resource {rid} STOPPED" in capsys.readouterr().out
    with emu.client() as client:
        assert client.post_training.model_resources.retrieve(rid).status.endswith("STOPPED")
    ip.run_line_magic("tg", "pt stop --leftovers")
    assert "no leftover model resources" in capsys.readouterr().out


def test_bad_input_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    """``tgnb pt stop`` without what to stop, and an inactivity timeout out of the API's range,
    are refused with one line that names the fix (nothing sent: no endpoint answers here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOGETHER_", "TGNB_"))}
    env.update(TGNB_HOME=str(tmp_path), TOGETHER_BASE_URL="http://127.0.0.1:9")
    stop = subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "pt", "stop"], env=env, capture_output=True, text=True
    )
    assert stop.returncode == 2
    assert stop.stderr.strip().splitlines() == [
        "tgnb pt stop: say what to stop: --leftovers (every resource left running by a process "
        "that is gone; 'tgnb pt leftovers' lists them first)"
    ]
    env.update(TOGETHER_API_KEY="k", TGNB_PT_INACTIVE_TIMEOUT="10")
    script = "import tgnb.tinker as tinker\ntinker.ServiceClient()\n"
    bad = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1] == (
        "tgnb.errors.ConfigError: TGNB_PT_INACTIVE_TIMEOUT='10': give whole seconds from 300 to "
        "86400, e.g. TGNB_PT_INACTIVE_TIMEOUT=900 (or unset it for the default, 900)"
    )
