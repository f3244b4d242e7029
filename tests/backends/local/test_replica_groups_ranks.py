"""Replica groups of several processes (issue 50: "a group is a node's processes, DDP or FSDP
inside it") on the local engine: a run launched with ``fault_tolerance="torchft"``, two nodes and
two processes per node runs each group as its own torchrun with ``--nproc_per_node=2`` (its own
rendezvous and store), every rank with the groups' contract (`tgnb.runs.ft.group_env`). The
program is DDP or FSDP inside each group and TorchFT's Manager across groups, real gloo both
(`tests/backends/ft_workdir/train_ft_ranks.py`, never importing tgnb), or the same DDP loop under
tgnb's ``Checkpointer(..., fault_tolerant=True)`` (`train_loop_ft_ranks.py`: its metrics rows and
checkpoints written once per step, by one group, every rank of it). One group's node preempted mid-run: both ranks of the
survivor go on without a restart, the replacement's two ranks heal from the live peer, every step
is trained once, and every rank of both groups ends with the same weights.

This machine has no GPU and a local run has one process per GPU of this machine
(`tgnb.backends.local.command.host_gpus`): the test gives the supervisor two visible devices
(``CUDA_VISIBLE_DEVICES``), the machine's boundary, so the engine renders two processes per group;
the program runs on the CPU (torch sees no CUDA driver)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.events import GROUP_JOINED, GROUP_LEFT, LIGHTHOUSE_STARTED, QUORUM_CHANGED, RUN_RESUMED
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session

from .test_replica_groups import FT_WORKDIR, end_soon, healed_since_left, of, steps

pytest.importorskip("torchft")
#: a cap: the test ends the run through ``FT_UNTIL`` once the replacement has healed
ENV = {"FT_STEPS": "100000", "FT_STEP_S": "0.05"}
RANKS = 2


def lines(run: Run, group: int, rank: int, key: str) -> list[dict[str, Any]]:
    """Rank `rank` of group `group`'s lines that hold `key`."""
    return [s for s in steps(run) if s.get("group") == group and s.get("rank") == rank and key in s]


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("inside", ["ddp", "fsdp", "checkpointer"])
def test_groups_of_two_ranks_survive_a_preemption_and_the_replacement_heals_both_ranks(
    session: Session, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, inside: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(RANKS))))
    until = tmp_path / "until"
    env = {**ENV, "FT_UNTIL": str(until), "FT_INSIDE": inside}
    script = "train_loop_ft_ranks.py" if inside == "checkpointer" else "train_ft_ranks.py"
    run = session.launch(script, workdir=FT_WORKDIR, name=f"ft-{inside}", nodes=2,
                         gpus_per_node=RANKS, env=env,
                         fault_tolerance="torchft", recovery=RecoveryPolicy(max_restarts=2))  # fmt: skip
    wait_until(lambda: all(any(s["step"] >= 10 and s["participants"] == 2
                               for s in lines(run, g, r, "step"))
                           for g in (0, 1) for r in range(RANKS)),
               300, what="both ranks of both groups training in one quorum")  # fmt: skip
    # each group is its own torchrun of two ranks: its own store, the contract in every rank
    started = [s for s in steps(run) if "started" in s]
    assert sorted((s["group"], s["rank"]) for s in started) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    ports = {s["group"]: s["master_port"] for s in started}
    assert len(ports) == 2 and ports[0] != ports[1], started
    lighthouse = of(run, LIGHTHOUSE_STARTED)[0]["data"]["address"]
    for s in started:
        assert s["world_size"] == s["local_world_size"] == str(RANKS), s
        assert s["groups"] == "2" and s["lighthouse"] == lighthouse and s["inside"] == inside, s
        assert ports[s["group"]] == s["master_port"], started
    first = {(s["group"], s["rank"]): s["pid"] for s in started}

    joined = {e["data"]["group"]: e["node"] for e in of(run, GROUP_JOINED)}
    session.preempt(joined[0])
    wait_until(lambda: healed_since_left(run, 0), 300, what="group 0's replacement healed")
    wait_until(lambda: all(lines(run, 0, r, "step")[-1]["participants"] == 2
                           and len(lines(run, 0, r, "started")) == 2 for r in range(RANKS)),
               120, what="both replacement ranks training beside the survivor")  # fmt: skip
    target = end_soon(run, until)
    final = run.wait(timeout=300)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-40:])

    left = [e["data"] for e in of(run, GROUP_LEFT)]
    assert (left[0]["group"], left[0]["cause"]) == (0, "notice"), left
    groups = [(e["data"]["group"], e["data"]["replacement"]) for e in of(run, GROUP_JOINED)]
    assert groups.count((1, False)) == 1 and groups[2:] == [(0, True)], groups  # 1 never restarted
    alone = [e for e in of(run, QUORUM_CHANGED) if e["data"]["groups"] == [1]]
    assert alone and alone[-1]["data"]["step"] >= 10, of(run, QUORUM_CHANGED)
    healed = healed_since_left(run, 0)
    assert healed[-1]["source"] == 1 and healed[-1]["step"] >= 10, healed
    for rank in range(RANKS):
        # the survivor's ranks: the same processes from start to end, each step once, in order
        # (a step not committed when the peer vanished is tried again under its number)
        assert len(lines(run, 1, rank, "started")) == 1, rank
        theirs = [s["step"] for s in lines(run, 1, rank, "step")]
        assert theirs == sorted(theirs) and sorted(set(theirs)) == list(
            range(theirs[0], target + 1)
        ), (rank, theirs[:5], theirs[-5:])
        # the replacement's ranks: new processes that enter at the survivor's step, not at 0
        again = lines(run, 0, rank, "started")[1]
        assert again["pid"] != first[(0, rank)]
        mine = lines(run, 0, rank, "step")
        before = [s["step"] for s in mine if s["t"] < again["started"]]
        after = [s["step"] for s in mine if s["t"] > again["started"]]
        assert after[0] > before[-1] >= 10 and after[-1] == target, (before[-3:], after[:3])
        assert after == sorted(after) and sorted(set(after)) == list(range(after[0], target + 1))
    # every rank of both groups ends at the same step with the same weights (healed rank by rank)
    done = [s for s in steps(run) if "done" in s]
    ends = {(s["group"], s["rank"]): s for s in done}
    assert {k: s["done"] for k, s in ends.items()} == {
        (g, r): target for g in (0, 1) for r in range(RANKS)
    }, done
    sums = [float(s["checksum"]) for s in ends.values()]
    assert max(sums) - min(sums) < 1e-9 * max(1.0, abs(sums[0])), ends
    # steps count once in the run's record too: its metrics rows (the Checkpointer's own, one per
    # step from the writing group; else the quorum's steps, `tgnb.backends.local.quorums.StepRows`)
    rows = [r["step"] for r in run.records("metrics")]
    assert rows == sorted(set(rows)) and run.summary()["steps"] == target, (rows[-3:], target)
    if inside == "checkpointer":
        assert rows == list(range(1, target + 1)), (rows[:3], rows[-3:], target)
        assert run.run_dir is not None
        recorded = [json.loads(line) for line in (run.run_dir / "events.jsonl").open()]
        saved = [e["data"]["step"] for e in recorded if e["reason"] == "CheckpointSaved"]
        assert saved and len(saved) == len(set(saved)) and saved[-1] == target, saved
        assert not [e for e in recorded if e["reason"] == RUN_RESUMED], "a checkpoint was loaded"
        log = (run.run_dir / "train.log").read_text(errors="replace")
        assert log.count("tgnb: replica group 0 left at step") == 1, log[-3000:]  # not per rank
