"""`when_short="standard"` end to end through TRL on the local emulator: a 1-node run of the
built-in tiny model on a preemptible node is preempted while the preemptible capacity is withdrawn
(the admin knob ``set_capacity``); after `wait_s` it restarts on the cluster's standard node from
its checkpoint, and once the capacity is back (the cap lifted, and the drained nodes released as the
platform reclaims a node whose workload has exited: admin ``release``) the supervisor moves it back
to a preemptible node at its next restart (SIGTERM: it checkpoints and restarts there). Its
GPU-hours are counted per node class (`tgnb.notebook.cost.run_cost`, what ``%tg cost`` shows).
Nothing is faked."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import (
    JOB_PLACED,
    JOB_RELEASED,
    RECOVERY_DECIDED,
    RUN_EXITED,
    RUN_RESUMED,
    RUN_STARTED,
)
from tgnb.notebook.cost import run_cost
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.spec import JobState
from tgnb.session import Session

pytestmark = pytest.mark.slow
MAX_STEPS = 1000  # 40 to 100+ steps/s on 2-core machines: the stretch on the standard node (3
# steps, then a preemptible node provisioned and the supervisor's next look, seconds) leaves steps
# to train after it (250 were all done before the move back on a faster machine)
PRE, STD = "gpu-preemptible-", "gpu-dp-"


@pytest.mark.timeout(900)
def test_standard_moves_to_the_standard_node_through_trl_and_back(
    emu: EmulatorHandle,
    session: Session,
) -> None:
    cid = session.cluster.id
    run = session.launch(
        "sft", name="trl-standard", max_steps=MAX_STEPS,
        recovery=RecoveryPolicy(when_short="standard", wait_s=1.0),
        checkpoint={"drain_poll_seconds": 0.2},
    )  # fmt: skip

    def on(prefix: str) -> bool:
        st = run.status
        return st.state == JobState.RUNNING and st.nodes[0].startswith(prefix)

    def step() -> int:
        return max((int(r["step"]) for r in run.records("metrics") if "step" in r), default=0)

    wait_until(lambda: on(PRE) and step() >= 3, timeout=600)
    emu.set_capacity(0, cid)  # no preemptible capacity: nothing replaces the nodes reclaimed
    mine = run.status.nodes[0]
    for n in emu.nodes(cid):
        if n["kind"] == "preemptible" and n["state"] == "running" and n["name"] != mine:
            session.preempt(n["name"])
    session.preempt(mine)
    wait_until(lambda: run.restart_count == 1 and on(STD), timeout=300)
    resumed_at = wait_until(lambda: next(
        (e.data["step"] for e in run.run_events() if e.reason == RUN_RESUMED), None
    ), timeout=300)  # fmt: skip
    wait_until(lambda: step() >= resumed_at + 3, timeout=300)  # it trains on the standard node
    emu.set_capacity(None, cid)  # capacity is back: the next restart is on a preemptible node
    for n in emu.nodes(cid):  # their workloads have exited: the platform reclaims them now
        if n["kind"] == "preemptible" and n["state"] == "draining":
            emu.release(cid, n["name"])
    wait_until(lambda: run.restart_count == 2 and on(PRE), timeout=300)
    assert step() < MAX_STEPS, "it finished before it moved back: raise MAX_STEPS"
    status = run.wait(timeout=600)
    assert status.state == JobState.SUCCEEDED, status

    evs = run.events()
    decided = [(e.data["rule"], e.data["node_class"], e.message) for e in evs
               if e.reason == RECOVERY_DECIDED and e.data["action"] == "start"]  # fmt: skip
    # the first placement, the move after wait_s, the decision to go back (the run is stopped on
    # the standard node) and the placement on the preemptible node
    assert [(r, c) for r, c, _ in decided] == [
        ("full", "preemptible"), ("standard", "standard"), ("full", "preemptible"),
        ("full", "preemptible"),
    ], decided  # fmt: skip
    assert decided[1][2].startswith(
        "moved to 1 standard node: 0 of 8 preemptible GPUs allocated for"
    )
    assert decided[2][2] == "back to preemptible: on 1 preemptible node", decided
    resumed = [(e.node or "", e.data["step"]) for e in evs if e.reason == RUN_RESUMED]
    assert [n[: len(STD)] == STD for n, _ in resumed] == [True, False], resumed
    assert resumed[0][1] >= 3 and resumed[1][1] >= resumed[0][1] + 3, resumed  # from checkpoints
    summary = run.summary()
    assert summary["steps"] == MAX_STEPS and summary["steps_lost"] <= 2, summary  # two restarts
    assert summary["restarts"] == 2 and summary["preemptions"] == 1, summary  # and one move
    assert sorted(run.metrics()["step"].unique()) == list(range(1, MAX_STEPS + 1))

    own = run.run_events()
    cost = run_cost(run.name, own, gpus=8)  # what `%tg cost` shows
    # seconds each node was held: the engine's placement to its release (tgnb.runs.meter), which
    # holds the program's own start to its exit
    spans: dict[str, float] = {PRE: 0.0, STD: 0.0}
    ran: dict[str, float] = {PRE: 0.0, STD: 0.0}
    for pairs, (opens, closes) in ((spans, (JOB_PLACED, JOB_RELEASED)),
                                   (ran, (RUN_STARTED, RUN_EXITED))):  # fmt: skip
        for started in (e for e in own if e.reason == opens):
            ended = next(e for e in own if e.reason == closes and e.time > started.time)
            pairs[PRE if (started.node or "").startswith(PRE) else STD] += (
                ended.time - started.time
            ).total_seconds()
    assert spans[STD] >= ran[STD] > 0 and spans[PRE] >= ran[PRE] > 0, (spans, ran)
    assert cost.standard_gpu_hours == pytest.approx(spans[STD] * 8 / 3600), (cost, spans)
    assert cost.preemptible_gpu_hours == pytest.approx(spans[PRE] * 8 / 3600), (cost, spans)
    assert cost.preemptions == 1, cost  # the move back is no preemption
    assert cost.lost_steps <= 1, cost
