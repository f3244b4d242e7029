"""``Run.wait()`` shows a text bar on stderr (steps done of max_steps, ETA, state); the run is a
real local-backend run of the stand-in trainer on the real emulator (no TRL: the bar is the point)."""

from __future__ import annotations

import re

import pytest

from tgnb.session import Session

pytestmark = pytest.mark.usefixtures("standin")


def test_wait_shows_steps_eta_and_the_final_state(
    session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    run = session.launch("grpo", name="bar", max_steps=12, env={"STANDIN_STEP_SECONDS": "0.2"})
    capsys.readouterr()
    status = run.wait(timeout=120)
    captured = capsys.readouterr()
    assert status.state.value == "succeeded"
    lines = [x for x in re.split(r"[\r\n]", captured.err) if x.strip()]
    assert lines and lines[0].startswith("run bar: ")
    assert re.search(r"^run bar: 100%.*\| 12/12 \[\d\d:\d\d<00:00.*succeeded\]$", lines[-1]), lines
    # then, on stdout (a result, no error block in a notebook), what it cost: the engine's meter
    said = captured.out.strip().splitlines()
    assert said and re.fullmatch(
        r"run bar: succeeded \(.*\); [\d.e-]+ GPU-h, \$[\d.]+, 0 preemptions", said[-1]
    ), said
    assert run.wait(progress=False).state.value == "succeeded"
    assert capsys.readouterr().err == ""


def test_a_notebook_shows_a_run_and_a_capacity_wait_as_sentences(session: Session) -> None:
    """IPython's display of a run and of a capacity wait: a sentence each, not the repr
    (``<Run ... pending>``, ``WaitResult(...)`` showed in the README's tour)."""
    from IPython.lib.pretty import pretty

    run = session.launch("grpo", name="shown", max_steps=2)
    run.wait(timeout=120, progress=False)
    assert re.fullmatch(r"run shown: succeeded on \S+ \(local engine\), 0 restarts", pretty(run))
    waited = session.cluster.wait_for_capacity(timeout=5)
    assert pretty(waited) == str(waited) and pretty(waited).startswith("capacity ")
