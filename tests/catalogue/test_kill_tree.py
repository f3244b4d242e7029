"""The fault catalogue's table for a job's kill on the local backend: it reaches the job's whole
process tree.

A two-node run under real torchrun (``torch.distributed.run``, one agent per emulated node, each
worker in a session of its own) on a real emulator daemon, its nodes' program the workload tests'
stand-in (`tests/backends/local/standin_train.py`: steps, a checkpoint on SIGTERM or drain, the pid of
each start recorded) instead of TRL, so that a case costs torchrun's start, not training's. Each
case kills the job the way the platform or the user does and checks that every worker of the
attempt is gone -- none training beside the next attempt.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.backends.local import supervisor_alive
from tgnb.emulator.testing import running_emulator
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session, attach

from .conftest import record

STANDIN = Path(__file__).parents[1] / "backends" / "local"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def worker_pids(run: Run) -> list[int]:
    assert run.run_dir is not None
    path = run.run_dir / "standin-env.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [int(json.loads(line)["pid"]) for line in lines]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN) + (os.pathsep + path if path else ""))
    with running_emulator(tmp_path, time_scale=0.02):
        yield tmp_path
        from tgnb.session import shutdown_local

        shutdown_local(tmp_path, timeout=90)


def two_node_run(home: Path, cluster_type: str, **env: str) -> tuple[Session, Run, list[int]]:
    session = attach(local=True, home=home, cluster_type=cluster_type)
    assert session.scale(preemptible=16, wait=True, timeout=90, poll=0.2)
    env = {"STANDIN_STEP_SECONDS": "0.1", **env}
    run = session.launch("grpo", name="tree", nodes=2, max_steps=100_000, env=env)
    pids = wait_until(lambda: len(worker_pids(run)) >= 2 and worker_pids(run), timeout=240)
    wait_until(lambda: len(run.records("metrics")) >= 4)  # the workers train (and handle signals)
    return session, run, pids[:2]


def _check(pids: list[int], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for p in left:  # clean up after a failing case
        os.kill(p, signal.SIGKILL)
    record(not left)
    assert not left, f"workers {left} of the killed attempt are still running"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("cluster_type", "env"),
    [("SLURM", {"STANDIN_IGNORE_NOTICE": "1"}), ("KUBERNETES", {"STANDIN_IGNORE_SIGTERM": "1"})],
    ids=["slurm-drain-ignored", "kubernetes-sigterm-ignored"],
)
def test_a_node_removed_kills_every_worker_of_the_attempt(
    home: Path, cluster_type: str, env: dict[str, str]
) -> None:
    """The node goes at the end of the drain window: SIGKILL. No worker of that attempt trains on
    beside the next one."""
    session, run, pids = two_node_run(home, cluster_type, **env)
    session.preempt(run.status.nodes[0])
    wait_until(lambda: "JobKilled" in [e.reason for e in run.events()], timeout=120)
    _check(pids)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stopping_a_run_whose_supervisor_died_kills_every_worker(home: Path) -> None:
    """The supervisor is SIGKILLed (the machine's OOM killer, say); `run.stop()` then ends the
    run's processes itself: the agents and their workers."""
    _, run, pids = two_node_run(home, "KUBERNETES")
    sup = int(run.refresh().jobs[0].info["pid"])
    os.kill(sup, signal.SIGKILL)
    wait_until(lambda: not supervisor_alive(sup), timeout=30)
    run.stop()
    assert run.refresh().state == JobState.CANCELLED
    _check(pids)


@pytest.mark.training
@pytest.mark.timeout(300)
def test_shutdown_right_after_a_launch_is_quick_and_clean(tmp_path: Path) -> None:
    """`shutdown_local` just after `launch` (the real runtime: its supervisor imports the training
    stack first): the run ends cancelled within shutdown_local's own timeout, and no error blames
    the machine. (How long it took is printed, not asserted: the machine is shared.)"""
    from tgnb.emulator import daemon
    from tgnb.session import shutdown_local

    home = tmp_path
    with running_emulator(home, time_scale=0.02):
        session = attach(local=True, home=home)
        session.scale(preemptible=8)
        run = session.launch("dpo", name="hasty", max_steps=5)
        began = time.monotonic()
        try:
            shutdown_local(home, timeout=60)
        except TimeoutError as exc:
            record(False)
            raise AssertionError(f"shutdown_local: {exc}") from None
        took = time.monotonic() - began
    print(f"shutdown_local took {took:.1f} s")
    ok = run.refresh().state == JobState.CANCELLED
    record(ok)
    assert ok, (run.refresh().state, run.refresh().detail, took)
    assert not daemon.status(home).running
