"""``%tg scale --wait`` in a terminal IPython (no kernel, so no widget front end) shows a text bar
of allocated against desired preemptible GPUs, not a widget's repr. Real shell, real emulator."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle


def test_scale_wait_in_a_terminal_shows_a_text_bar(
    ip: Any, tg: Any, attached: EmulatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    assert getattr(ip, "kernel", None) is None
    capsys.readouterr()
    result = ip.run_line_magic("tg", "scale --preemptible 8 --wait --timeout 60s")
    out, err = capsys.readouterr()
    assert result.reached
    assert "ClusterPanel" not in out + err and "HTML(" not in out + err
    last = [x for x in re.split(r"[\r\n]", err) if x.strip()][-1]
    assert re.fullmatch(r"preemptible GPUs: .* 8/8 allocated \[\d\d:\d\d\]", last), err
