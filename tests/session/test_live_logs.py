"""Live logs (issue 47 §3): ``run.logs(follow=True)`` follows a run's output across its attempts
on the local engine (a real emulator over HTTP, the real supervisor, real processes), each attempt
after a header line that says its node, its start and how the one before it ended, read from the
engine's own ``JobPlaced`` / ``JobReleased``; Ctrl-C stops following and leaves the run alone."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.events import JOB_PLACED
from tgnb.runs import livelog
from tgnb.runs.spec import JobState
from tgnb.session import Session

PLAIN = """\
    import sys, time

    steps = int(sys.argv[1])
    for step in range(1, steps + 1):
        time.sleep(0.05)
        print(f"step {step}", flush=True)
    print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_follow_marks_each_attempt_and_prints_every_line_once(
    session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(PLAIN))
    run = session.launch("train.py", args=["60"], workdir=wd, name="followed")
    capsys.readouterr()  # the launch's own lines
    preempted: list[Any] = []

    def preempt_once() -> None:  # while the main thread follows
        wait_until(lambda: len(run.logs()) >= 15 and run.status.nodes, timeout=240)
        preempted.append(session.preempt(run.status.nodes[0]))

    helper = threading.Thread(target=preempt_once, daemon=True)
    helper.start()
    run.logs(follow=True)  # returns once the run has ended
    helper.join(timeout=60)
    assert preempted, "the run was not preempted"
    assert run.state is JobState.SUCCEEDED, run.status
    out = capsys.readouterr().out.splitlines()

    headers = [i for i, line in enumerate(out) if line.startswith(livelog.HEADER)]
    assert len(headers) == 2, out[:5]
    placed = [e for e in run.run_events() if e.reason == JOB_PLACED]
    assert [e.data["restart_count"] for e in placed] == [0, 1], placed
    first, second = (out[i] for i in headers)
    assert first.startswith(f"── attempt 1 on {placed[0].node}, started "), first
    assert placed[0].time.strftime("%H:%M:%SZ") in first, (first, placed[0])
    assert "attempt 0" not in first and "ended" not in first, first
    assert second.startswith(f"── attempt 2 on {placed[1].node}, started "), second
    assert second.endswith("; attempt 1: preempted ──"), second
    assert headers[0] == 0 and out[headers[1] + 1] == "step 1", out[headers[1] - 2 : headers[1] + 2]
    assert out[-1].startswith("── run followed: succeeded") and out[-1].endswith(" ──"), out[-1]

    # every line of both attempts once, in order: the log's own lines, the headers taken out
    followed = [ln for i, ln in enumerate(out[:-1]) if i not in headers]
    assert followed == run.logs(), (followed[:5], run.logs()[:5])
    attempt_one = followed[: headers[1] - 1]
    assert attempt_one[:3] == ["step 1", "step 2", "step 3"] and "done" not in attempt_one
    assert followed[headers[1] - 1 :] == [f"step {i}" for i in range(1, 61)] + ["done"]


class _Run:
    """A run whose output stops with a Ctrl-C after two lines (what `livelog` reads of a Run)."""

    name = "fake"

    def __init__(self) -> None:
        self.stopped = False

    def follow(self, records: bool = False, poll: float = 0.2, raw: bool = False) -> Any:
        yield "one"
        yield "two"
        raise KeyboardInterrupt

    def run_events(self) -> list[Any]:
        return []

    def refresh(self) -> Any:
        raise AssertionError("no attempt marker: nothing to read")

    def closing_line(self) -> str:
        raise AssertionError("an interrupted follow does not reach the run's end")

    def stop(self) -> None:
        self.stopped = True


def test_ctrl_c_stops_following_and_leaves_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    run = _Run()
    livelog.show(run)
    assert capsys.readouterr().out.splitlines() == [
        "one",
        "two",
        "(stopped following fake; the run goes on)",
    ]
    assert not run.stopped
