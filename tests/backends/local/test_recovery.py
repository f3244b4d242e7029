"""The recovery policy on the local engine (`tgnb.runs.recovery` rendered by the supervisor):
a real emulator daemon whose preemptible capacity is withdrawn and restored with the admin knob
``set_capacity`` while a run is preempted. The training program is the stand-in
(tests/backends/local/standin_train.py: checkpoints on SIGTERM, exits 75, resumes from its checkpoint);
test_recovery_trl.py runs the same through TRL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import RECOVERY_DECIDED, RUN_FAILED_RESTARTING
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session

from .test_backend import starts

pytestmark = pytest.mark.usefixtures("standin")
ENV = {"STANDIN_STEP_SECONDS": "0.1"}


def decisions(run: Run) -> list[dict[str, Any]]:
    return [{"reason": e.message, **e.data} for e in run.events() if e.reason == RECOVERY_DECIDED]


def nodes_now(run: Run) -> tuple[str, ...]:
    return tuple(run.status.nodes) if run.status.state == JobState.RUNNING else ()


def preemptible_up(emu: EmulatorHandle, cluster: str) -> int:
    return sum(
        1 for n in emu.nodes(cluster) if n["kind"] == "preemptible" and n["state"] == "running"
    )


def test_shrink_restarts_on_one_node_and_grows_back(emu: EmulatorHandle, session: Session) -> None:
    cid = session.cluster.id
    policy = RecoveryPolicy(when_short="shrink", wait_s=1.0)
    # a step takes 0.05 s at 2 nodes, 0.1 s at 1 (the stand-in's STANDIN_FULL_NODES): the shrunk
    # attempt trains at ENV's pace, so as many steps are left at the second preemption, and the
    # last attempt, at 2 nodes, trains what is left at twice that pace
    env = {"STANDIN_STEP_SECONDS": "0.05", "STANDIN_FULL_NODES": "2"}
    run = session.launch("grpo", name="shrinks", nodes=2, min_nodes=1, recovery=policy,
                         max_steps=400, env=env)  # fmt: skip
    wait_until(lambda: len(nodes_now(run)) == 2 and len(run.metrics()) >= 5)
    first = nodes_now(run)
    emu.set_capacity(8, cid)  # one preemptible node's worth: no replacement for the one reclaimed
    session.preempt(first[0])
    wait_until(lambda: run.restart_count == 1 and len(nodes_now(run)) == 1, timeout=120)
    shrunk = decisions(run)[-1]
    assert shrunk["rule"] == "shrink" and shrunk["nodes"] == 1, decisions(run)
    assert shrunk["reason"].startswith("shrunk to 1 node: 8 of 16 preemptible GPUs allocated for")
    emu.set_capacity(None, cid)  # capacity is back, and more: the target rises to three nodes
    assert session.scale(preemptible=24, wait=True, timeout=120, poll=0.2)
    wait_until(lambda: preemptible_up(emu, cid) == 3, timeout=120)
    session.preempt(nodes_now(run)[0])
    wait_until(lambda: run.restart_count == 2 and len(nodes_now(run)) == 2, timeout=120)
    assert decisions(run)[-1]["rule"] == "full" and decisions(run)[-1]["nodes"] == 2
    assert run.wait(timeout=240).state == JobState.SUCCEEDED, run.status
    assert len(starts(run)) == 5  # two processes at 2 nodes, one at 1, two at 2 again


def test_standard_moves_after_wait_s_and_back(emu: EmulatorHandle, session: Session) -> None:
    cid = session.cluster.id
    policy = RecoveryPolicy(when_short="standard", wait_s=1.0)
    run = session.launch("grpo", name="moves", recovery=policy, max_steps=300, env=ENV)
    wait_until(lambda: len(nodes_now(run)) == 1 and len(run.metrics()) >= 5)
    emu.set_capacity(0, cid)  # no preemptible capacity at all
    for name in [n["name"] for n in emu.nodes(cid) if n["kind"] == "preemptible"]:
        if name not in nodes_now(run):
            session.preempt(name)
    session.preempt(nodes_now(run)[0])
    wait_until(lambda: any(n.startswith("gpu-dp-") for n in nodes_now(run)), timeout=120)
    moved = [d for d in decisions(run) if d["node_class"] == "standard"]
    assert moved and moved[0]["rule"] == "standard", decisions(run)
    assert moved[0]["reason"].startswith("moved to 1 standard node: 0 of 8 preemptible GPUs")
    emu.set_capacity(None, cid)
    wait_until(lambda: any(n.startswith("gpu-preemptible-") for n in nodes_now(run)), timeout=180)
    assert any(d["reason"].startswith("back to preemptible") for d in decisions(run))
    assert run.wait(timeout=240).state == JobState.SUCCEEDED, run.status
    classes = [s["TGNB_NODE"].split("-dp-")[0] for s in starts(run)]
    assert classes[0] == "gpu-preemptible" and "gpu" in classes and classes[-1] == "gpu-preemptible"


def test_wait_waits_for_preemptible_capacity(emu: EmulatorHandle, session: Session) -> None:
    cid = session.cluster.id
    run = session.launch("grpo", name="waits", max_steps=200, env=ENV)
    wait_until(lambda: len(nodes_now(run)) == 1 and len(run.metrics()) >= 5)
    emu.set_capacity(0, cid)
    for n in emu.nodes(cid):
        if n["kind"] == "preemptible":
            session.preempt(n["name"])
    wait_until(lambda: run.status.state == JobState.PENDING and run.restart_count == 1, timeout=120)
    waiting = decisions(run)[-1]
    assert waiting["action"] == "wait" and waiting["rule"] == "wait", decisions(run)
    assert waiting["reason"].startswith("waiting for 1 preemptible node: 0 of 8 preemptible GPUs")
    emu.set_capacity(None, cid)
    assert run.wait(timeout=240).state == JobState.SUCCEEDED, run.status
    assert all(s["TGNB_NODE"].startswith("gpu-preemptible-") for s in starts(run))


def test_failures_count_and_preemptions_do_not(session: Session) -> None:
    run = session.launch("grpo", name="fails", max_steps=10,
                         recovery=RecoveryPolicy(max_restarts=2, backoff_s=0.2),
                         env={**ENV, "STANDIN_FAIL": "1"})  # fmt: skip
    assert run.wait(timeout=120).state == JobState.FAILED, run.status
    counted = [e.data for e in run.events() if e.reason == RUN_FAILED_RESTARTING]
    assert [c["failures"] for c in counted] == [1, 2]
    assert [c["backoff_s"] for c in counted] == [0.2, 0.4]
    assert len(starts(run)) == 3
