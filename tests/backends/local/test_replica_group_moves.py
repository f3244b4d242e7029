"""The recovery policy of a fault-tolerant run (issue 50), group by group, on the local engine
(`tgnb.backends.local.groupplace`): with ``when_short="standard"``, a group preempted while no
preemptible capacity is left (the emulator's admin knob ``set_capacity``) is placed on the
cluster's standard node after ``wait_s`` and heals from the survivor; once the capacity is back it
moves to a preemptible node (it leaves as ``moved``, neither a failure nor a preemption) and heals
again. The survivor never restarts, the run's steps are trained once, and each group's node is
metered at its own class's price, within the emulator's bill (`test_replica_group_bill.bill`).
Real processes: TorchFT's own API (`tests/backends/ft_workdir/train_ft.py`) under a real
lighthouse, on a real emulator over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import (
    GROUP_JOINED,
    GROUP_LEFT,
    JOB_PLACED,
    QUORUM_CHANGED,
    RECOVERY_DECIDED,
)
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.spec import JobState
from tgnb.session import Session

from .test_replica_group_bill import bill
from .test_replica_groups import ENV, FT_WORKDIR, end_soon, healed_since_left, of, steps

pytest.importorskip("torchft")
STD, PRE = "gpu-dp-", "gpu-preemptible-"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_group_moves_to_a_standard_node_after_wait_s_and_back(
    session: Session, emu: EmulatorHandle, tmp_path: Path
) -> None:
    cid = session.cluster.id
    until = tmp_path / "until"  # the run ends there once group 0 has healed twice (`end_soon`)
    run = session.launch(
        "train_ft.py", workdir=FT_WORKDIR, name="ft-moves", nodes=2,
        env={**ENV, "FT_UNTIL": str(until)},
        fault_tolerance="torchft",
        recovery=RecoveryPolicy(when_short="standard", wait_s=1.0, max_restarts=2),
    )  # fmt: skip
    wait_until(lambda: any(s.get("step", 0) >= 20 and s["participants"] == 2 for s in steps(run)),
               240, what="both groups training in one quorum")  # fmt: skip
    joined = {e["data"]["group"]: e["node"] for e in of(run, GROUP_JOINED)}
    emu.set_capacity(8, cid)  # the survivor's node's worth: nothing replaces the one reclaimed
    session.preempt(joined[0])

    def replacements() -> list[tuple[str, str]]:
        return [(e["node"], e["data"]["node_class"]) for e in of(run, GROUP_JOINED)
                if e["data"]["group"] == 0 and e["data"]["replacement"]]  # fmt: skip

    def heals() -> int:
        return len(healed_since_left(run, 0))

    wait_until(lambda: len(replacements()) == 1, 180, what="group 0 placed again")
    assert replacements()[0][0].startswith(STD) and replacements()[0][1] == "standard"
    wait_until(lambda: heals() >= 1, 180, what="group 0 healed on the standard node")
    emu.set_capacity(None, cid)  # capacity is back: a preemptible node is provisioned
    for n in emu.nodes(cid):  # the reclaimed node's workload has exited: the platform takes it
        if n["kind"] == "preemptible" and n["state"] == "draining":
            emu.release(cid, n["name"])
    wait_until(lambda: len(replacements()) == 2, 240, what="group 0 back on a preemptible node")
    assert replacements()[1][0].startswith(PRE) and replacements()[1][1] == "preemptible"
    wait_until(lambda: heals() >= 2, 180, what="group 0 healed on the preemptible node")
    assert not run.status.state.finished, "the run ended before the move back"
    target = end_soon(run, until)
    final = run.wait(timeout=400)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-40:])

    # each decision on the timeline once, with its group: the move after wait_s, then back
    decided = [(e["data"]["rule"], e["data"]["node_class"], e["message"])
               for e in of(run, RECOVERY_DECIDED)
               if e["data"].get("group") == 0 and e["data"]["action"] == "start"]  # fmt: skip
    assert [(r, c) for r, c, _ in decided] == [
        ("standard", "standard"), ("full", "preemptible"), ("full", "preemptible")
    ], decided  # fmt: skip
    assert decided[0][2].startswith("group 0: moved to 1 standard node: "), decided
    assert decided[1][2] == "group 0: back to preemptible: on 1 preemptible node", decided
    # the class of each group's node, as placed
    placed = [(e["data"]["group"], e["data"]["node_class"]) for e in of(run, JOB_PLACED)]
    assert placed == [(0, "preemptible"), (1, "preemptible"), (0, "standard"),
                      (0, "preemptible")], placed  # fmt: skip
    left = [(e["data"]["group"], e["data"]["cause"]) for e in of(run, GROUP_LEFT)]
    assert [c for g, c in left if g == 0][:2] == ["notice", "moved"], left
    assert [c for g, c in left if g == 1] == ["finished"], left  # the survivor never restarted
    healed_from = healed_since_left(run, 0)
    assert [h["source"] for h in healed_from] == [1, 1], healed_from
    assert healed_from[1]["step"] > healed_from[0]["step"] >= 20, healed_from
    # the run's steps trained once: the survivor's never went back, the quorum's never either
    theirs = [s["step"] for s in steps(run) if s.get("group") == 1 and "step" in s]
    assert theirs == sorted(theirs) and theirs[-1] == target
    quorum = [e["data"]["step"] for e in of(run, QUORUM_CHANGED)]
    assert quorum == sorted(quorum), quorum
    # metered per group at its node's class: the standard stretch ends "moved", no failure, one
    # preemption; within the emulator's bill of those nodes (`bill` asserts it)
    out = bill(run, emu, cid)
    mine = [(s.node_class, s.cause) for s in out["held"] if s.group == 0]
    assert mine == [("preemptible", "preempted"), ("standard", "moved"),
                    ("preemptible", "done")], out["held"]  # fmt: skip
    summary = run.summary()
    assert summary["preemptions"] == 1, summary
    assert any("moved" in line for line in summary["groups"]), summary["groups"]
