"""End to end on the emulator: a real daemon over real HTTP, the real ``tgnb.train`` runtime
(TRL on the CPU, the built-in tiny model and tasks), real processes and signals.

Attach, raise the preemptible target to 16, wait for the two nodes, launch on preemptible, preempt
the run's node mid-run; then the events must show the preemption notice, a checkpoint saved inside
the (scaled) drain window, the node removed, a replacement added and the run resumed, and the run
must finish at max_steps with at most one step lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState
from tgnb.emulator import daemon
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import (
    CHECKPOINT_SAVED,
    DRAIN_NOTICE,
    NODE_ADDED,
    PREEMPTED,
    PREEMPTION_NOTIFIED,
    RUN_RESUMED,
    SIGNAL_RECEIVED,
)
from tgnb.runs.run import Run
from tgnb.session import Session, attach

from .conftest import make_session, stop_everything

pytestmark = pytest.mark.slow
MAX_STEPS = 200  # a fast machine ran all of 30 between step 5 and the preemption
FAST_DRAIN = {"drain_poll_seconds": 0.2}


def preempt_mid_run(session: Session, run: Run, at_step: int) -> str:
    """Wait until the run has done `at_step` steps, then preempt its node; the node's name."""
    wait_until(lambda: len(run.records("metrics")) >= at_step, 300)
    node = run.status.nodes[0]
    session.preempt(node)
    return node


def check_recovery(run: Run, node: str, slurm: bool = False) -> None:
    """The events and the outcome the issue asks for, read back from a reattached `Run`."""
    status = run.wait(timeout=300)
    assert status.state == JobState.SUCCEEDED, status
    assert status.restart_count == 1 and node not in status.nodes
    wait_until(
        lambda: (
            any(e.reason == PREEMPTED and e.node == node for e in run.events())
            and any(e.reason == NODE_ADDED and e.time > _removed(run, node) for e in run.events())
        ),
        60,
    )
    evs = run.events()
    notice = next(e for e in evs if e.reason == PREEMPTION_NOTIFIED and e.node == node)
    removed = _removed(run, node)
    saved = [e for e in evs if e.reason == CHECKPOINT_SAVED and e.node == node]
    inside = [e for e in saved if notice.time <= e.time <= removed]
    assert inside, f"no checkpoint in the window {notice.time}..{removed}: {saved}"
    trigger = inside[0].data["trigger"]
    assert trigger == ("drain" if slurm else "signal")
    heard = DRAIN_NOTICE if slurm else SIGNAL_RECEIVED
    assert any(e.reason == heard and e.node == node for e in evs)
    if slurm:
        assert not [e for e in evs if e.reason == SIGNAL_RECEIVED]
    resumed = [e for e in evs if e.reason == RUN_RESUMED]
    assert len(resumed) == 1 and resumed[0].node != node
    assert resumed[0].data["step"] == inside[0].data["step"]
    replacement = [e for e in evs if e.reason == NODE_ADDED and e.time > removed]
    assert replacement and replacement[0].node != node
    summary = run.summary()
    assert summary["steps"] == MAX_STEPS == summary["max_steps"]
    assert summary["steps_lost"] <= 1
    steps = sorted(run.metrics()["step"].unique())
    assert steps == list(range(1, MAX_STEPS + 1))


def _removed(run: Run, node: str):  # type: ignore[no-untyped-def]
    return min(e.time for e in run.events() if e.reason == PREEMPTED and e.node == node)


def test_tgnb_demo_grpo_then_reattach_and_check(tmp_path: Path) -> None:
    """The README's main job: ``tgnb demo`` (it starts its own emulator daemon for this home)."""
    env = dict(os.environ, TGNB_HOME=str(tmp_path))
    env.pop("TOGETHER_API_KEY", None)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tgnb.cli", "demo", "--home", str(tmp_path),
             "--max-steps", str(MAX_STEPS), "--preempt-at", "5"],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        for word in (PREEMPTION_NOTIFIED, CHECKPOINT_SAVED, PREEMPTED, NODE_ADDED, RUN_RESUMED):
            assert word in out.stdout
        assert f"steps {MAX_STEPS}/{MAX_STEPS}" in out.stdout
        session = attach(local=True, home=tmp_path)  # a new kernel: reattach through the store
        (run,) = session.runs()
        node = next(h.node for h in run.history() if h.node)
        assert node is not None
        check_recovery(run, node)
    finally:
        from tgnb.runs.store import RunStore

        stop_everything(RunStore(tmp_path))
        daemon.stop(tmp_path)


def test_dpo_preempted_mid_run_resumes(session: Session) -> None:
    run = session.launch("dpo", name="e2e-dpo", max_steps=MAX_STEPS, checkpoint=FAST_DRAIN)
    node = preempt_mid_run(session, run, 5)
    check_recovery(session.run("e2e-dpo"), node)


def test_grpo_drain_path_on_a_slurm_cluster(emu: EmulatorHandle, tmp_path: Path) -> None:
    session = make_session(tmp_path, "SLURM")
    run = session.launch("grpo", name="e2e-slurm", max_steps=MAX_STEPS, checkpoint=FAST_DRAIN)
    node = preempt_mid_run(session, run, 5)
    check_recovery(run, node, slurm=True)
