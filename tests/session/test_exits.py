"""Exits that say what happened (`tgnb.runs.outcome`), on the local engine: real emulator over
HTTP, the real supervisor, torchrun, torch on the CPU and signals.

- a protected loop under torchrun (``command=[torchrun, ...]``) preempted: torchrun exits 1 after
  the sealed checkpoint, the attempt is still a preemption (75), no failure is counted and
  `Run.error` is empty once it has finished;
- a script with no hook that exits 0 on SIGTERM is restarted, "stopped without a checkpoint at
  step N: N steps lost" is said, and the run is named unprotected (at launch and in the summary),
  its lost steps counted from the rows it logged; so is the same script run as a ``command=``;
- the default checkpoint policy (``checkpoint.auto``) saves periodically, so a kill with no
  notice loses at most one interval. The kill with no notice is a preemption of a run whose policy
  turns the signal and the drain notice off (``on_signal``/``watch_drain`` false): SIGTERM then
  kills the process unsaved, as the loss of its node would.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import CHECKPOINT_SAVED, RUN_FAILED_RESTARTING, RUN_REQUEUED, RUN_RESUMED
from tgnb.notebook.commands.runs import runs_table
from tgnb.runs.outcome import UNPROTECTED
from tgnb.runs.policy import AUTO_MAX_SECONDS
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session

from ..backends.local.conftest import make_session

SCRIPTS = Path(__file__).parent / "exits_workdir"
STEP_S = 0.05


def _workdir(tmp_path: Path, script: str) -> Path:
    wd = tmp_path / f"wd-{Path(script).stem}"
    wd.mkdir()
    shutil.copy(SCRIPTS / script, wd / script)
    return wd


def _events(run: Run, reason: str) -> list[Any]:
    return [e for e in run.run_events() if e.reason == reason]


def _preempt_at(session: Session, run: Run, rows: int) -> str:
    """Preempt the run's node once it has logged `rows` steps; the node."""
    wait_until(lambda: len(run.records("metrics")) >= rows and run.status.nodes, timeout=240)
    node = run.status.nodes[0]
    session.preempt(node)
    return str(node)


@pytest.mark.slow
@pytest.mark.parametrize("emu", [0.1], indirect=True)  # a 30 s window: torchrun's exit fits
@pytest.mark.parametrize("cluster_type", ["SLURM", "KUBERNETES"])
def test_torchrun_after_a_sealed_preemption_checkpoint_is_a_preemption(
    emu: EmulatorHandle, tmp_path: Path, cluster_type: str
) -> None:
    """SLURM: the drain notice reaches the worker, which seals its checkpoint and exits 75;
    torchrun exits 1 (tgnb's node process turns it into 75). KUBERNETES: torchrun gets the SIGTERM
    too, passes it on and lingers until the node is removed (killed): the record decides."""
    session = make_session(tmp_path, cluster_type)
    wd = _workdir(tmp_path, "loop.py")
    run = session.launch(
        command=["torchrun", "--standalone", "--nproc_per_node=1", "loop.py", "--steps", "120"],
        workdir=wd,
        name="torchrun-loop",
        checkpoint={"drain_poll_seconds": 0.2},
        recovery=RecoveryPolicy(max_restarts=0),  # one failure counted would end the run
    )
    _preempt_at(session, run, 10)
    status = run.wait(timeout=400, progress=False)
    assert status.state is JobState.SUCCEEDED, (status, run.logs()[-30:])
    (requeued,) = _events(run, RUN_REQUEUED)
    sealed = requeued.data["sealed_step"]
    assert f"was preempted: sealed checkpoint at step {sealed} (exit " in requeued.message
    if cluster_type == "SLURM":
        assert requeued.data["exit_code"] == 75  # torchrun's 1, read with the record
    assert not _events(run, RUN_FAILED_RESTARTING)
    assert run.error() is None  # no torchrun traceback on a run that succeeded
    summary = run.summary()
    assert summary["protected"] and summary["note"] is None
    assert summary["restarts"] == 1 and summary["steps_lost"] <= 1


@pytest.mark.slow
def test_exit_0_on_sigterm_without_a_checkpoint_is_restarted_and_said(
    session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wd = _workdir(tmp_path, "quits.py")
    yaml_text = session.launch("quits.py", args=["60"], workdir=wd, name="dry", dry_run=True)
    assert "script: quits.py" in yaml_text
    warned = f"tgnb: quits.py is {UNPROTECTED}: call tgnb.train.protect(trainer)"
    assert warned in capsys.readouterr().out  # --dry-run warns
    run = session.launch("quits.py", args=["60"], workdir=wd, name="quits")
    assert warned in capsys.readouterr().out  # and so does the launch
    _preempt_at(session, run, 10)
    wait_until(lambda: _events(run, RUN_REQUEUED), timeout=120)
    (requeued,) = _events(run, RUN_REQUEUED)
    lost = requeued.data["steps_lost"]
    assert requeued.message.startswith(f"stopped without a checkpoint at step {lost}: {lost} steps")
    assert lost >= 10 and requeued.data["unsaved"]
    said = [c.detail for c in run.history() if c.state is JobState.REQUEUED]
    assert said == [requeued.message.partition(" (exit")[0]], said  # the status line
    status = run.wait(timeout=300, progress=False)
    assert status.state is JobState.SUCCEEDED and status.restart_count == 1, status
    summary = run.summary()
    assert summary["protected"] is False and summary["note"] == UNPROTECTED
    assert runs_table([run]).rows[0][-1] == UNPROTECTED  # what %tg runs shows
    assert summary["steps_lost"] == lost and summary["steps"] == 60  # from what it logged
    assert run.error() is None


@pytest.mark.slow
def test_a_command_that_exits_0_on_sigterm_without_a_checkpoint_is_restarted_and_said(
    session: Session, tmp_path: Path
) -> None:
    """The same script as a ``command=`` (its own launcher: never under torchrun): the node's
    ``python -m tgnb.train`` passes the SIGTERM on, records the unsaved stop and exits 75."""
    wd = _workdir(tmp_path, "quits.py")
    run = session.launch(command=["python", "quits.py", "30"], workdir=wd, name="quits-command")
    _preempt_at(session, run, 5)
    status = run.wait(timeout=300, progress=False)
    assert status.state is JobState.SUCCEEDED and status.restart_count == 1, status
    (requeued,) = _events(run, RUN_REQUEUED)
    lost = requeued.data["steps_lost"]
    line = f"stopped without a checkpoint at step {lost}: {lost} steps lost"
    assert requeued.message == f"{line} (exit 75)" and requeued.data["unsaved"], requeued
    assert lost >= 5 and not _events(run, RUN_FAILED_RESTARTING)
    steps = [int(r["step"]) for r in run.records("metrics")]
    assert len(steps) == 30 + lost and run.summary()["steps"] == 30


@pytest.mark.slow
def test_the_default_policy_bounds_a_kill_with_no_notice_to_one_interval(
    session: Session, tmp_path: Path
) -> None:
    wd = _workdir(tmp_path, "loop.py")
    run = session.launch(
        "loop.py",
        args=["--steps", "400", "--sleep", str(STEP_S)],
        workdir=wd,
        name="no-notice",
        checkpoint={"on_signal": False, "watch_drain": False},  # the kill comes unannounced
    )
    periodic = lambda: [  # noqa: E731
        e for e in _events(run, CHECKPOINT_SAVED) if e.data.get("trigger") == "periodic"
    ]
    wait_until(periodic, timeout=240)  # none ever came before checkpoint.auto was the default
    saved = max(e.data["step"] for e in periodic())
    _preempt_at(session, run, saved + 5)
    status = run.wait(timeout=400, progress=False)
    assert status.state is JobState.SUCCEEDED, (status, run.logs()[-30:])
    (resumed,) = _events(run, RUN_RESUMED)
    requeued = _events(run, RUN_REQUEUED)[0].time
    before = [e.data["step"] for e in periodic() if e.time < requeued]
    assert resumed.data["step"] == max(before) >= saved  # the newest periodic save, not step 0
    summary = run.summary()
    lost = summary["steps_lost"]
    assert summary["steps"] == 400 and summary["protected"]
    assert lost * STEP_S <= AUTO_MAX_SECONDS  # at most one interval, never above the bound
    steps = [int(r["step"]) for r in run.records("metrics")]
    assert len(steps) - 400 == lost, (lost, len(steps))  # the steps logged twice: lost
