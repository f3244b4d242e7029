"""The local backend's supervision on a real emulator daemon (real HTTP, real processes and
signals). The training program here is a stand-in (`standin_train.py`, a step counter that
checkpoints to a JSON file) so that placement, signals, kills and requeues are checked in seconds;
the end-to-end tests run the real ``tgnb.train`` runtime."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState
from tgnb.emulator import daemon
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import PREEMPTED, PREEMPTION_NOTIFIED
from tgnb.runs.run import Run
from tgnb.session import Session

from .conftest import make_session

pytestmark = pytest.mark.usefixtures("standin")


def starts(run: Run) -> list[dict[str, Any]]:
    """The environment each start of the stand-in saw."""
    assert run.run_dir is not None
    path = run.run_dir / "standin-env.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def running_on(run: Run) -> str:
    return str(wait_until(lambda: run.status.state == JobState.RUNNING and run.status.nodes[0]))


def test_placement_preemptible_and_standard_and_gpu_accounting(session: Session) -> None:
    env = {"STANDIN_STEP_SECONDS": "0.1"}
    pre = [session.launch("grpo", name=f"pre-{i}", max_steps=25, env=env) for i in range(3)]
    std = session.launch("grpo", name="std-0", preemptible=False, max_steps=5, env=env)
    for run in (*pre, std):
        assert run.wait(timeout=120).state == JobState.SUCCEEDED, run.status
    for run in pre:
        (first,) = starts(run)
        assert first["TGNB_NODE"].startswith("gpu-preemptible-dp-")
        assert first["TGNB_NOTICE_FILE"] is None and first["SLURM_RESTART_COUNT"] is None
    assert starts(std)[0]["TGNB_NODE"].startswith("gpu-dp-")
    # Two preemptible nodes of 8 GPUs and three runs of 8 GPUs each: never two on one node at once.
    spans = []
    for run in pre:
        hist = run.history()
        began = next(h.time for h in hist if h.state == JobState.RUNNING)
        ended = next(h.time for h in hist if h.state == JobState.SUCCEEDED)
        spans.append((starts(run)[0]["TGNB_NODE"], began, ended))
    for i, (node_a, a0, a1) in enumerate(spans):
        for node_b, b0, b1 in spans[i + 1 :]:
            if node_a == node_b:
                assert a1 <= b0 or b1 <= a0, spans
    waited = [h.detail for run in pre for h in run.history() if h.state == JobState.PENDING]
    assert any("waiting for 1 schedulable preemptible node" in d for d in waited), waited


def test_kubernetes_preemption_sigterm_then_pod_recreated(session: Session) -> None:
    run = session.launch("grpo", name="k8s-term", max_steps=60, env={"STANDIN_STEP_SECONDS": "0.1"})
    node = running_on(run)
    wait_until(lambda: len(run.metrics()) >= 5)
    session.preempt(node)
    assert run.wait(timeout=120).state == JobState.SUCCEEDED
    first, second = starts(run)
    assert first["TGNB_NODE"] == node and second["TGNB_NODE"] != node
    assert (first["TGNB_RESTART_COUNT"], second["TGNB_RESTART_COUNT"]) == ("0", "1")
    assert run.restart_count == 1
    evs = run.events()
    notice = next(e for e in evs if e.reason == PREEMPTION_NOTIFIED and e.node == node)
    sent = next(e for e in evs if e.reason == "SignalSent")
    saved = next(e for e in evs if e.reason == "CheckpointSaved")
    assert notice.time <= sent.time <= saved.time and saved.data["why"] == "signal"
    assert [e.data["step"] for e in evs if e.reason == "RunResumed"] == [saved.data["step"]]
    assert run.metrics()["step"].max() == 60


def test_kubernetes_sigkill_at_the_end_of_the_window(session: Session) -> None:
    env = {"STANDIN_STEP_SECONDS": "0.1", "STANDIN_IGNORE_SIGTERM": "1"}
    run = session.launch("grpo", name="k8s-kill", max_steps=150, env=env)
    node = running_on(run)
    wait_until(lambda: len(run.records("metrics")) >= 2)  # its SIGTERM disposition is set
    session.preempt(node)
    wait_until(lambda: run.restart_count == 1, timeout=60)
    evs = run.events()
    removed = wait_until(
        lambda: [e for e in run.events() if e.reason == PREEMPTED and e.node == node], 30
    )[0]
    killed = next(e for e in evs if e.reason == "JobKilled")
    notice = next(e for e in evs if e.reason == PREEMPTION_NOTIFIED)
    # Killed at removal (T+window: 6 s here), not at the notice.
    assert killed.time >= notice.time and abs((killed.time - removed.time).total_seconds()) < 2.0
    assert (killed.time - notice.time).total_seconds() > 3.0
    run.stop()
    assert run.wait(timeout=60).state == JobState.CANCELLED


def test_slurm_drain_no_signal_then_requeued(emu: EmulatorHandle, tmp_path: Path) -> None:
    session = make_session(tmp_path, "SLURM")
    run = session.launch(
        "grpo", name="slurm-drain", max_steps=60, env={"STANDIN_STEP_SECONDS": "0.1"}
    )
    node = running_on(run)
    wait_until(lambda: len(run.metrics()) >= 5)
    session.preempt(node)
    assert run.wait(timeout=120).state == JobState.SUCCEEDED
    first, second = starts(run)
    assert (first["SLURM_RESTART_COUNT"], second["SLURM_RESTART_COUNT"]) == ("0", "1")
    assert first["TGNB_NOTICE_FILE"].endswith(f"/nodes/{node}/preemption-notice.json")
    evs = run.events()
    assert not [e for e in evs if e.reason == "SignalSent"]  # a drain sends no signal
    assert next(e for e in evs if e.reason == "CheckpointSaved").data["why"] == "drain"
    assert "drained" in " ".join(h.detail for h in run.history())


def test_slurm_job_ignoring_the_drain_is_killed_and_requeued(
    emu: EmulatorHandle, tmp_path: Path
) -> None:
    session = make_session(tmp_path, "SLURM")
    env = {"STANDIN_STEP_SECONDS": "0.1", "STANDIN_IGNORE_NOTICE": "1"}
    run = session.launch("grpo", name="slurm-kill", max_steps=150, env=env)
    node = running_on(run)
    session.preempt(node)
    wait_until(lambda: len(starts(run)) == 2, timeout=60)
    reasons = [e.reason for e in run.events()]
    assert "JobKilled" in reasons and "SignalSent" not in reasons
    assert starts(run)[-1]["SLURM_RESTART_COUNT"] == "1"
    run.stop()
    assert run.wait(timeout=60).state == JobState.CANCELLED


def test_reattach_from_a_new_kernel(session: Session, tmp_path: Path) -> None:
    run = session.launch("grpo", name="survivor", max_steps=30, env={"STANDIN_STEP_SECONDS": "0.1"})
    running_on(run)
    script = (
        "import json, tgnb\n"
        f"s = tgnb.attach(local=True, home={str(tmp_path)!r})\n"
        "r = s.run('survivor')\n"
        "st = r.wait(timeout=120)\n"
        "print(json.dumps({'runs': [x.name for x in s.runs()], 'state': st.state.value,"
        " 'steps': int(r.metrics()['step'].max())}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"runs": ["survivor"], "state": "succeeded", "steps": 30}


@pytest.mark.slow
def test_emulator_killed_mid_run_loses_no_run_record(
    emu: EmulatorHandle, session: Session, tmp_path: Path
) -> None:
    run = session.launch(
        "grpo", name="through-restart", max_steps=120, env={"STANDIN_STEP_SECONDS": "0.1"}
    )
    node = running_on(run)
    os.kill(emu.pid, signal.SIGKILL)  # the daemon dies without any clean-up
    wait_until(lambda: not daemon.status(tmp_path).running, 10)
    time.sleep(1.5)  # the supervisor polls a dead endpoint meanwhile
    st, started = daemon.start(tmp_path, daemon.ServeOptions.of(time_scale=0.02), emu.api_key)
    assert started and st.pid != emu.pid
    again = make_session(tmp_path, target=0)
    assert again.cluster.id == session.cluster.id  # the emulator kept its clusters
    again.preempt(node)  # through the new daemon: the supervisor must notice it
    assert run.wait(timeout=120).state == JobState.SUCCEEDED
    rec = again.run("through-restart")
    states = [h.state for h in rec.history()]
    assert states == [
        JobState.PENDING,
        JobState.RUNNING,
        JobState.REQUEUED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ], states
    assert rec.restart_count == 1 and int(rec.metrics()["step"].max()) == 120
    assert rec.run_dir is not None
    log = (rec.run_dir / "supervisor.log").read_text()
    assert "emulator unreachable" in log and "emulator reachable again" in log


def test_lost_supervisor_is_seen_and_recovered(session: Session) -> None:
    run = session.launch("grpo", name="orphan", max_steps=80, env={"STANDIN_STEP_SECONDS": "0.1"})
    running_on(run)
    wait_until(lambda: len(run.records("metrics")) >= 3)
    pid = run.record.jobs[-1].info["pid"]
    os.kill(pid, signal.SIGKILL)  # as if the machine had restarted under it
    status = wait_until(lambda: (st := run.status).state == JobState.UNKNOWN and st, 10)
    assert "session.recover()" in status.detail
    assert session.recover() == ["orphan"]
    assert run.wait(timeout=120).state == JobState.SUCCEEDED
    envs = starts(run)
    assert len(envs) == 2  # the orphaned process was stopped before the new start
    steps = run.metrics()["step"].tolist()
    assert max(steps) == 80 and steps.count(80) == 1
    evs = session.events(since="10m")
    assert {"JobPlaced", "RunStarted", "RunResumed"} <= {e.reason for e in evs}
    assert any(e.source == "cluster" for e in evs)
    assert session.events(since=timedelta(seconds=0)) == []


def test_shutdown_local_stops_unfinished_runs_then_the_emulator(
    session: Session, tmp_path: Path
) -> None:
    """What `tgnb notebooks run --stop` and `tgnb demo --stop` do at the end: a run still going is
    stopped (its detached supervisor would outlive the daemon), then the emulator daemon."""
    from tgnb.session import shutdown_local

    run = session.launch("grpo", name="long", max_steps=10_000, env={"STANDIN_STEP_SECONDS": "0.1"})
    running_on(run)
    shutdown_local(tmp_path)
    assert run.status.state == JobState.CANCELLED, run.status
    assert not daemon.status(tmp_path).running
