"""The own-code examples of ``examples/`` (a TRL SFTTrainer script, a plain PyTorch loop and an
Accelerate loop through the Checkpointer, a Lightning script), each launched from that folder as
its docstring says (``session.launch(script, workdir="examples", args=...)``), preempted once and
finished with every step logged once.

Everything is real: the emulator daemon over HTTP, the supervisor, TRL, Accelerate, Lightning and
torch on the CPU, the built-in tiny model and data (nothing from the Hub)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tgnb.session import Session

from .test_user_code import FAST_DRAIN, _steps, preempt_times

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: script -> (steps, the line it prints at its end). Steps enough that the run still trains when
#: the preemption lands (it is sent once the attempt has logged 4 steps). A TRL step is the slow
#: one: a fast machine logged 21 steps of the user's SFTTrainer script (tests/session/user_workdir)
#: before its notice landed, 2 cores under load 13; 60 leaves that again twice. The other loops
#: step many times faster on the tiny model, so they keep 200.
SCRIPTS = {
    "sft_trl.py": (60, "sft example: done"),
    "plain_loop.py": (200, "plain loop: done"),
    "accelerate_loop.py": (200, "accelerate loop: done"),
    "lightning_fit.py": (200, "lightning example: done"),
}


def test_every_example_script_is_covered_and_says_how_to_launch_it() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py")} - {"arithmetic_data.py", "tinker_rl.py"}
    assert scripts == set(SCRIPTS)
    for name in SCRIPTS:
        doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text())) or ""
        assert f"python examples/{name}" in doc, name
        assert f'session.launch("{name}", workdir="examples"' in doc, name
        assert f"%tg launch {name} --workdir examples" in doc, name


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_an_example_preempted_once_finishes_with_no_step_lost(
    session: Session, script: str
) -> None:
    max_steps, done = SCRIPTS[script]
    run = session.launch(
        script,
        workdir=EXAMPLES,
        args=["--max-steps", str(max_steps)],
        name=f"example-{Path(script).stem.replace('_', '-')}",
        checkpoint=FAST_DRAIN,
        env={"HF_HUB_OFFLINE": "1"},
    )
    preempt_times(session, run, 1)
    status = run.wait(timeout=600, progress=False)
    assert status.state.value == "succeeded", run.logs()[-30:]
    steps = _steps(run.records("metrics"))
    assert steps == list(range(1, max_steps + 1)), steps  # every step logged once
    summary = run.summary()
    assert summary["kind"] == "script" and summary["steps"] == max_steps, summary
    assert summary["restarts"] == 1 and summary["preemptions"] == 1, summary
    assert summary["steps_lost"] <= 1, summary  # at most the step the notice interrupted
    assert done in run.logs()
