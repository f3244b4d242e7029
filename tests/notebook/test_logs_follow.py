"""``%tg logs RUN -f`` (issue 47 §3) in a real IPython shell against a real emulator: a run
preempted once is followed in the cell until it ends, each attempt after its header line, every
line of both attempts once and in order; bad input is a UsageError naming the fix."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.runs.livelog import HEADER

PLAIN = """\
    import sys, time

    for step in range(1, int(sys.argv[1]) + 1):
        time.sleep(0.05)
        print(f"step {step}", flush=True)
"""


def test_bad_input_names_the_fix(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    with pytest.raises(UsageError, match=r"^%tg logs: name the run: %tg logs RUN \(-f to follow"):
        ip.run_line_magic("tg", "logs -f")
    with pytest.raises(UsageError, match=r"^%tg logs: no run named 'nope': %tg runs --all lists"):
        ip.run_line_magic("tg", "logs nope -f")
    with pytest.raises(UsageError, match=r"^%tg logs: unknown argument 'more'"):
        ip.run_line_magic("tg", "logs nope more -f")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_follow_a_preempted_run_in_the_cell(
    ip: Any, tg: Any, attached: EmulatorHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ip.run_line_magic("tg", "scale --preemptible 8 --wait --timeout 60s").reached
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(PLAIN))
    ip.run_line_magic("tg", f"launch train.py --workdir {wd} --name tail-f -o run -- 40")
    run = ip.user_ns["run"]
    capsys.readouterr()

    def preempt_once() -> None:
        wait_until(lambda: len(run.logs()) >= 10 and run.status.nodes, timeout=240)
        tg.session.preempt(run.status.nodes[0])

    helper = threading.Thread(target=preempt_once, daemon=True)
    helper.start()
    ip.run_line_magic("tg", "logs tail-f -f")  # returns when the run has ended
    helper.join(timeout=60)
    out = capsys.readouterr().out.splitlines()
    headers = [i for i, line in enumerate(out) if line.startswith(HEADER)]
    assert len(headers) == 2, out[:5]
    assert out[headers[0]].startswith("── attempt 1 on gpu-preemptible"), out[headers[0]]
    assert out[headers[1]].endswith("; attempt 1: preempted ──"), out[headers[1]]
    assert out[-1].startswith("── run tail-f: succeeded"), out[-1]
    body = [line for i, line in enumerate(out[:-1]) if i not in headers]
    assert body == run.logs(), (body[:3], run.logs()[:3])
    second = out[headers[1] + 1 : -1]
    assert second == [f"step {i}" for i in range(1, 41)], second[:3]
