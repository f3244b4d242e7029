"""A fault-tolerant run (``fault_tolerance="torchft"``, issue 50) on the local engine: two replica
groups of a DDP program on TorchFT's own API (`tests/backends/ft_workdir/train_ft.py`: Manager,
DistributedDataParallel, Optimizer, ProcessGroupGloo) under a real lighthouse, on a real emulator
over HTTP. A group lost (a preemption with notice, or its processes SIGKILLed with none) leaves the
quorum; the other trains on without a restart; a replacement group is placed and heals from it
(it enters at the survivor's step, with no checkpoint)."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.local import proctree
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import (
    GROUP_HEALED,
    GROUP_JOINED,
    GROUP_LEFT,
    LIGHTHOUSE_STARTED,
    QUORUM_CHANGED,
)
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.server.serialize import run_json
from tgnb.session import Session

from .test_process_model import DDP_WORKDIR

pytest.importorskip("torchft")
FT_WORKDIR = DDP_WORKDIR.parent / "ft_workdir"
#: a cap: each test ends the run through ``FT_UNTIL`` (`end_soon`) once what it waits for happened
ENV = {"FT_STEPS": "100000", "FT_STEP_S": "0.05"}
#: one of the program's lines: a flat JSON object
LINE = re.compile(r'\{"group": [^{}]*\}')


def events(run: Run) -> list[dict[str, Any]]:
    assert run.run_dir is not None
    path = run.run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e.get("source") == "tgnb"]


def of(run: Run, reason: str) -> list[dict[str, Any]]:
    return [e for e in events(run) if e["reason"] == reason]


def steps(run: Run) -> list[dict[str, Any]]:
    """The program's own lines (one JSON object per step) in the run's log."""
    assert run.run_dir is not None
    path = run.run_dir / "train.log"
    out = []
    text = path.read_text(errors="replace") if path.exists() else ""
    for found in LINE.finditer(
        text
    ):  # wherever it stands: another process's output may share its line
        with contextlib.suppress(ValueError):  # one cut short
            out.append(json.loads(found.group()))
    return out


def healed_since_left(run: Run, group: int) -> list[dict[str, Any]]:
    """Group `group`'s heals since it first left (a group that started behind the other, under
    load, healed once already at the start: that one is not its replacement's)."""
    out: list[dict[str, Any]] = []
    gone = False
    for e in events(run):
        if e["data"].get("group") != group:
            continue
        gone = gone or e["reason"] == GROUP_LEFT
        if gone and e["reason"] == GROUP_HEALED:
            out.append(e["data"])
    return out


def end_soon(run: Run, until: Path, more: int = 20) -> int:
    """Have the groups stop `more` steps after the furthest step trained so far (the program's
    ``FT_UNTIL`` file, written whole at once): the step they end at."""
    last = max((s.get("step", 0) for s in steps(run)), default=0) + more
    part = until.with_suffix(".part")
    part.write_text(str(last), encoding="utf-8")
    part.replace(until)
    return last


def launch(session: Session, name: str, until: Path) -> Run:
    env = {**ENV, "FT_UNTIL": str(until)}
    run = session.launch("train_ft.py", workdir=FT_WORKDIR, name=name, nodes=2, env=env,
                         fault_tolerance="torchft", recovery=RecoveryPolicy(max_restarts=2))  # fmt: skip
    wait_until(lambda: any(s.get("step", 0) >= 20 and s["participants"] == 2 for s in steps(run)),
               240, what="both groups training in one quorum")  # fmt: skip
    return run


def check_healed(run: Run, lost: int, until: Path) -> None:
    """Group `lost` left, the other never restarted, and the replacement healed from it; the run
    is ended (`end_soon`) once the replacement has healed."""
    wait_until(lambda: healed_since_left(run, lost), 240, what=f"group {lost}'s replacement healed")
    assert not run.status.state.finished
    target = end_soon(run, until)
    final = run.wait(timeout=300)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-40:])
    assert len(of(run, LIGHTHOUSE_STARTED)) == 1
    joined = of(run, GROUP_JOINED)
    survivor = 1 - lost
    assert [e["data"]["group"] for e in joined].count(survivor) == 1, joined  # never restarted
    assert [(e["data"]["group"], e["data"]["replacement"]) for e in joined][2:] == [(lost, True)]
    alone = [e for e in of(run, QUORUM_CHANGED) if e["data"]["groups"] == [survivor]]
    assert alone and alone[-1]["data"]["step"] >= 20, of(run, QUORUM_CHANGED)
    healed = healed_since_left(run, lost)
    assert healed and healed[-1]["source"] == survivor and healed[-1]["step"] >= 20, healed
    # the replacement's first step follows the survivor's step: healed, not trained from 0
    mine = [s for s in steps(run) if s.get("group") == lost]
    second = [i for i, s in enumerate(mine) if "started" in s][1]  # the replacement's start
    before = [s["step"] for s in mine[:second] if "step" in s]
    after = [s["step"] for s in mine[second:] if "step" in s]
    assert after[0] > before[-1] >= 20, (before[-3:], after[:3])
    theirs = [s["step"] for s in steps(run) if s.get("group") == survivor and "step" in s]
    assert theirs == sorted(theirs) and theirs[-1] == target  # never went back
    left = [e["data"] for e in of(run, GROUP_LEFT)]
    assert [d["group"] for d in left].count(survivor) == 1  # only at its end
    # steps count once, from the quorum (the program records none): the program's last step
    rows = [r["step"] for r in run.records("metrics")]
    assert rows == sorted(set(rows)) and run.summary()["steps"] == target, (rows[-3:], target)


@pytest.mark.slow
def test_a_preempted_group_leaves_and_a_replacement_heals(
    session: Session, emu: EmulatorHandle, tmp_path: Path
) -> None:
    run = launch(session, "ft-notice", tmp_path / "until")
    joined = {e["data"]["group"]: e["node"] for e in of(run, GROUP_JOINED)}
    session.preempt(joined[0])
    check_healed(run, lost=0, until=tmp_path / "until")
    left = [e["data"] for e in of(run, GROUP_LEFT) if e["data"]["group"] == 0]
    assert left[0]["cause"] == "notice", left
    # its money (`test_replica_group_bill`): the preempted node until its group was released,
    # the replacement's node from its placement, the gap between them nothing; one preemption
    # that redid nothing (the survivor trained on)
    from .test_replica_group_bill import bill

    held = bill(run, emu, session.cluster.id)["held"]
    # oldest first: group 0 is placed before group 1, its replacement after both
    assert [(s.group, s.cause) for s in held] == [(0, "preempted"), (1, "done"), (0, "done")], held
    gone, again = [s for s in held if s.group == 0]
    assert gone.end <= again.start and gone.node != again.node, (gone, again)
    summary = run.summary()
    assert summary["preemptions"] == 1 and summary["lost_node_seconds"] == 0, summary
    lines = summary["groups"]
    assert lines[1].startswith("group 0 left at step ") and "preempted (notice)" in lines[1]
    assert lines[2].startswith("group 0 joined again (replacement)") and (
        "healed from group 1 at step " in lines[2]
    ), lines
    assert run_json(run)["groups"] == lines  # what the sidebar shows under the run


@pytest.mark.slow
def test_a_group_killed_without_notice_is_replaced(session: Session, tmp_path: Path) -> None:
    run = launch(session, "ft-kill", tmp_path / "until")
    # group 1's processes, torchrun's worker included (tagged `<run id>.g1.<n>`), SIGKILLed
    tag = f"{run.id}.g1.2"
    assert proctree.kill_run(tag) >= 2
    check_healed(run, lost=1, until=tmp_path / "until")
    left = [e["data"] for e in of(run, GROUP_LEFT) if e["data"]["group"] == 1]
    assert left[0]["cause"] == "lost", left
    assert left[0]["exit_code"] != 0


@pytest.mark.slow
def test_a_cancel_stops_every_group_and_the_lighthouse(session: Session, tmp_path: Path) -> None:
    run = launch(session, "ft-cancel", tmp_path / "until")
    run.stop()
    final = run.wait(timeout=120)
    assert final.state == JobState.CANCELLED, final
    causes = {e["data"]["group"]: e["data"]["cause"] for e in of(run, GROUP_LEFT)}
    assert causes == {0: "stopped", 1: "stopped"}, causes
    assert not proctree.members(run.id)  # the lighthouse (tagged with the run's id) is gone
    assert not any(proctree.members(f"{run.id}.g{g}.{g + 1}") for g in (0, 1))
