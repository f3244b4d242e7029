"""The README's "A short tour", cell by cell as written, in a real IPython shell against a real
emulator daemon (loopback HTTP); the launched run trains the built-in tiny GRPO task with TRL on the
CPU and is stopped at the end. Each line of the README's code block is one cell: every one must run
without an error, and what each shows must be what its comment says."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import PREEMPTION_NOTIFIED
from tgnb.notebook.widgets import RunPanel
from tgnb.runs import Run
from tgnb.session import Preemption

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_cells() -> list[str]:
    """The lines of the code block under ``## A short tour``."""
    text = README.read_text()
    section = text[text.index("## A short tour") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the README's tour has no ```python block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_tour_has_the_steps_the_issue_names() -> None:
    cells = tour_cells()
    assert cells[0] == "%load_ext tgnb"
    assert any(c.startswith("%tg launch grpo") and "-o run" in c for c in cells)
    assert any(c.startswith("%tg watch run") for c in cells)


@pytest.mark.slow
def test_readme_tour_runs_as_written(
    ip: Any,
    tg: Any,
    emulator: EmulatorHandle,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in emulator.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tg.poll_interval = 0.2
    shown: dict[str, Any] = {}
    try:
        for cell in tour_cells():
            result = ip.run_cell(cell, store_history=False)
            out = capsys.readouterr()
            assert result.success, f"{cell!r} failed: {result.error_in_exec!r}\n{out.err}"
            shown[cell.split("#")[0].strip()] = (result.result, out.out)
        run = ip.user_ns["run"]
        assert isinstance(run, Run)
        watched = next(v for k, v in shown.items() if k.startswith("%tg watch run"))[0]
        assert isinstance(watched, RunPanel) and watched.run.id == run.id
        preempted = next(v for k, v in shown.items() if k.startswith("%tg preempt"))[0]
        assert isinstance(preempted, Preemption)
        assert repr(preempted).startswith(f"<Preemption {preempted.node}: notice at ")
        events = next(v for k, v in shown.items() if k.startswith("%tg events"))[1]
        assert PREEMPTION_NOTIFIED in events and preempted.node in events
        cost = str(next(v for k, v in shown.items() if k.startswith("%tg cost"))[0])
        assert run.name in cost and "runs launched or opened in this notebook" in cost

        # a run of another notebook on the same cluster: listed with --all only
        from tgnb.session import attach

        other = attach(None, local=True).launch("grpo", max_steps=1, name="other-notebook")
        other.stop()
        mine = str(ip.run_line_magic("tg", "runs"))
        assert run.name in mine and "other-notebook" not in mine
        assert "1 more on the cluster: add --all" in mine
        every = str(ip.run_line_magic("tg", "runs --all"))
        assert run.name in every and "other-notebook" in every
        assert "other-notebook" in str(ip.run_line_magic("tg", "cost --all"))
    finally:
        run = ip.user_ns.pop("run", None)
        if isinstance(run, Run):
            run.stop()
            deadline = time.monotonic() + 60
            while not run.refresh().state.finished and time.monotonic() < deadline:
                time.sleep(0.5)


def test_unattached_errors_start_with_their_subcommand(ip: Any, tg: Any) -> None:
    for sub in ("status", "runs", "cost", "watch x", "events"):
        with pytest.raises(UsageError, match=rf"^%tg {sub.split()[0]}: no cluster attached"):
            ip.run_line_magic("tg", sub)


def test_a_trailing_comment_is_not_parsed(ip: Any, tg: Any) -> None:
    with pytest.raises(UsageError, match=r"^%tg status: no cluster attached"):
        ip.run_line_magic("tg", "status   # the cluster now")


def test_only_a_comment_word_outside_quotes_is_dropped() -> None:
    from tgnb.notebook.magics import _without_comment

    line = "launch --set a=b#c --name 'x # y' --model \"m #1\"  # the reader's note"
    assert _without_comment(line) == "launch --set a=b#c --name 'x # y' --model \"m #1\"  "
    assert _without_comment("#all comment") == ""
    assert _without_comment("status") == "status"


@pytest.mark.slow
def test_readme_tour_run_all_shows_one_preemption_checkpoint_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tour as one notebook (a cell per line) run top to bottom by papermill, as Run All
    does, on a fresh tgnb home: `%tg preempt` waits for the run to train, so the run is preempted
    once, checkpoints, resumes once and finishes; `%tg watch run --wait` shows that end."""
    import nbformat

    from tgnb import batch
    from tgnb.config import EMULATOR_OWNER_ENV
    from tgnb.events import CHECKPOINT_SAVED, RUN_RESUMED
    from tgnb.session import attach, shutdown_local

    home = tmp_path / "home"
    monkeypatch.setenv("TGNB_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("TOGETHER_API_KEY", "TOGETHER_BASE_URL", EMULATOR_OWNER_ENV):
        monkeypatch.delenv(name, raising=False)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(line) for line in tour_cells()]
    source = tmp_path / "tour.ipynb"
    nbformat.write(nb, source)
    try:
        result = batch.run_notebook(source, tmp_path / "out", html=False)
        done = nbformat.read(result.output, as_version=4)
        session = attach(local=True, start=False)
        (run,) = session.runs()
        summary = run.summary()
        assert summary["state"] == "succeeded", summary
        assert summary["steps"] == summary["max_steps"] == 60, summary
        assert summary["preemptions"] == 1 and summary["restarts"] == 1, summary
        reasons = [e.reason for e in run.run_events()]
        assert reasons.count(RUN_RESUMED) == 1, reasons
        assert CHECKPOINT_SAVED in reasons, reasons
        # the cell that waited shows the end: the run succeeded, with its resume
        waited = next(
            i for i, c in enumerate(done.cells) if c.source.startswith("%tg watch run --wait")
        )
        html = str(done.cells[waited].outputs)
        assert "succeeded" in html and "1 resume" in html, html[:2000]
    finally:
        shutdown_local(home)
