"""A running emulator whose options differ from what a command asks: reused when they match,
restarted when the asking command started it (same ``$TGNB_EMULATOR_OWNER``), refused otherwise
with the fix. Real daemons through the real ``tgnb emulator`` command and `tgnb.attach`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tgnb
from tgnb.emulator import daemon
from tgnb.errors import EmulatorError, EmulatorMismatchError


def tgnb_emulator(
    home: Path, *args: str, owner: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TGNB_HOME": str(home)}
    env.pop(daemon.OWNER_ENV, None)
    if owner:
        env[daemon.OWNER_ENV] = owner
    return subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "emulator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_another_commands_emulator_with_another_time_scale_is_refused(tmp_path: Path) -> None:
    try:
        assert tgnb_emulator(tmp_path, "start").returncode == 0  # the default scale, no owner
        st = daemon.status(tmp_path)
        assert st.options and st.options["time_scale"] == 0.02 and st.owner is None
        assert "time scale 0.02" in st.describe()
        # asking nothing in particular reuses it
        again = tgnb_emulator(tmp_path, "start")
        assert again.returncode == 0 and again.stdout.startswith("already running"), again.stderr
        # asking another time scale is refused, with what differs and the fix
        asked = tgnb_emulator(tmp_path, "start", "--time-scale", "0.5", owner="someone-else")
        assert asked.returncode == 1
        assert "time scale 0.02 (asked 0.5)" in asked.stderr
        assert "tgnb emulator stop" in asked.stderr
        assert daemon.status(tmp_path).pid == st.pid
        # the same from Python: an explicit time scale must match, none reuses what runs
        with pytest.raises(EmulatorMismatchError, match=r"time scale 0.02 \(asked 0.5\)"):
            tgnb.attach(local=True, home=tmp_path, time_scale=0.5)
        session = tgnb.attach(local=True, home=tmp_path)
        assert session.cloud.base_url.startswith(st.base_url or "?")
        session.cloud.close()
        assert daemon.status(tmp_path).pid == st.pid
    finally:
        daemon.stop(tmp_path)


def test_the_starting_commands_own_emulator_is_restarted_with_what_it_asks(
    tmp_path: Path,
) -> None:
    try:
        first = tgnb_emulator(tmp_path, "start", "--time-scale", "0.5", owner="cmd-1")
        assert first.returncode == 0, first.stderr
        before = daemon.status(tmp_path)
        assert before.owner == "cmd-1"
        second = tgnb_emulator(tmp_path, "start", "--time-scale", "0.02", owner="cmd-1")
        assert second.returncode == 0 and second.stdout.startswith("started"), second.stderr
        after = daemon.status(tmp_path)
        assert after.running and after.pid != before.pid
        assert after.options and after.options["time_scale"] == 0.02
    finally:
        daemon.stop(tmp_path)


def test_attach_says_once_that_it_started_the_emulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOGETHER_API_KEY", raising=False)
    monkeypatch.delenv(daemon.OWNER_ENV, raising=False)
    # start=False (what the server extension does on a read) starts nothing
    with pytest.raises(EmulatorError, match="tgnb emulator start"):
        tgnb.attach(local=True, home=tmp_path, start=False)
    assert not daemon.status(tmp_path).running
    try:
        s1 = tgnb.attach(local=True, home=tmp_path)
        st = daemon.status(tmp_path)
        out = capsys.readouterr().out
        assert out == (
            f"started the local emulator on {st.base_url} (time scale 0.02); "
            "`tgnb emulator stop` stops it\n"
        )
        s2 = tgnb.attach(local=True, home=tmp_path, time_scale=0.02)
        assert capsys.readouterr().out == ""
        for s in (s1, s2):
            s.cloud.close()
    finally:
        daemon.stop(tmp_path)
