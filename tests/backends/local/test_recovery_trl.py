"""`when_short="shrink"` end to end through TRL on the local emulator: a 2-node run (torchrun, two
real processes) is preempted while the preemptible capacity is withdrawn (the admin knob
``set_capacity``), restarts on 1 node from its 2-node checkpoint with the global batch kept
(gradient accumulation doubled: `tgnb.train.preemption.batch_args`), and grows back to 2 nodes at
its next restart once the capacity is back. Nothing is faked."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import RECOVERY_DECIDED, RUN_RESUMED
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.spec import JobState
from tgnb.session import Session
from tgnb.train.checkpoint import checkpoint_dirs, read_marker

pytestmark = pytest.mark.slow
#: Long enough that the run still trains after its second restart. At 1 node a step takes a tenth of
#: one at 2 (no gloo all-reduce between two processes on the same cores): 2 cores under load trained
#: 44 steps a second there. The capacity comes back while the 1-node attempt starts, so the second
#: preemption follows its second step by one poll and one request (5 then 119 steps before it when
#: the scale-up still ran after those steps; a fast machine had 60, then 150); every step past it
#: runs at 2 nodes, the slow part of the test.
MAX_STEPS = 200


@pytest.mark.timeout(1200)
def test_shrink_resumes_at_one_node_through_trl_and_grows_back(
    emu: EmulatorHandle, session: Session
) -> None:
    cid = session.cluster.id
    run = session.launch(
        "sft", name="trl-shrink", nodes=2, min_nodes=1, max_steps=MAX_STEPS,
        recovery=RecoveryPolicy(when_short="shrink", wait_s=1.0),
        checkpoint={"drain_poll_seconds": 0.2},
    )  # fmt: skip

    def on(n: int) -> bool:
        st = run.status
        return st.state == JobState.RUNNING and len(st.nodes) == n

    wait_until(lambda: on(2) and len(run.records("metrics")) >= 3, timeout=600)
    emu.set_capacity(8, cid)
    session.preempt(run.status.nodes[0])
    wait_until(lambda: run.restart_count == 1 and on(1), timeout=300)
    at_one = len(run.records("metrics"))
    # placed at 1 node: capacity back now, while the attempt starts (a running run does not grow;
    # it grows back at its next restart)
    emu.set_capacity(None, cid)
    assert session.scale(preemptible=24, wait=True, timeout=120, poll=0.2)
    wait_until(lambda: len(run.records("metrics")) >= at_one + 2, timeout=600)
    session.preempt(run.status.nodes[0])
    wait_until(lambda: run.restart_count == 2 and on(2), timeout=300)
    assert run.run_dir is not None
    saved = [m.meta for p in checkpoint_dirs(run.run_dir / "checkpoints") if (m := read_marker(p))]
    assert {m["world_size"] for m in saved} >= {1}, saved  # saved at 1 node, at the preemption
    assert len({m["global_batch"] for m in saved}) == 1, saved  # the global batch kept
    status = run.wait(timeout=900)
    assert status.state == JobState.SUCCEEDED, status

    evs = run.events()
    rules = [(e.data["rule"], e.data["nodes"]) for e in evs if e.reason == RECOVERY_DECIDED]
    assert ("shrink", 1) in rules and rules[-1] == ("full", 2), rules
    resumed = [
        (e.data["saved_world_size"], e.data["world_size"]) for e in evs if e.reason == RUN_RESUMED
    ]
    assert resumed == [(2, 1), (1, 2)], resumed
    summary = run.summary()
    assert summary["steps"] == MAX_STEPS and summary["steps_lost"] <= 2  # two preemptions
    assert sorted(run.metrics()["step"].unique()) == list(range(1, MAX_STEPS + 1))
