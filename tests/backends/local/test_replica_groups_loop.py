"""A fault-tolerant run whose program is a plain loop under tgnb's Checkpointer with
``fault_tolerant=True`` (`tests/backends/ft_workdir/train_loop_ft.py`, issue 50), launched on the
local engine as two replica groups under a real lighthouse: one group preempted with notice leaves
without a save while the other keeps training without a restart; the replacement heals from it
(no checkpoint is loaded), every step is trained and recorded once, one group writes the periodic
checkpoints, and the run ends."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.events import GROUP_HEALED, GROUP_JOINED, GROUP_LEFT, QUORUM_CHANGED, RUN_RESUMED
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session

from .test_replica_groups import FT_WORKDIR, events, of

pytest.importorskip("torchft")
#: long enough for a replacement (a fresh interpreter importing torch) to join before the end
ENV = {"FT_STEPS": "600", "FT_STEP_S": "0.05"}
_LINE = re.compile(r'\{"group": [^{}]*\}')


def steps(run: Run) -> list[dict[str, Any]]:
    """The program's own objects (one per step) in the run's log, wherever they stand: the
    groups' lines and TorchFT's log lines may run into each other."""
    assert run.run_dir is not None
    path = run.run_dir / "train.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    out = []
    for m in _LINE.finditer(text):
        with contextlib.suppress(ValueError):  # one cut short
            out.append(json.loads(m.group(0)))
    return out


@pytest.mark.slow
@pytest.mark.training
def test_a_checkpointer_loop_preempted_heals_its_replacement_and_counts_each_step_once(
    session: Session,
) -> None:
    run = session.launch("train_loop_ft.py", workdir=FT_WORKDIR, name="ft-loop", nodes=2, env=ENV,
                         fault_tolerance="torchft", recovery=RecoveryPolicy(max_restarts=2))  # fmt: skip
    wait_until(lambda: any(s.get("step", 0) >= 20 and s["participants"] == 2 for s in steps(run)),
               240, what="both groups training in one quorum")  # fmt: skip
    joined = {e["data"]["group"]: e["node"] for e in of(run, GROUP_JOINED)}
    session.preempt(joined[0])
    final = run.wait(timeout=400)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-40:])
    assert run.run_dir is not None
    log = (run.run_dir / "train.log").read_text(errors="replace")
    # the preempted group left on its notice, without a save: its peer holds the state
    left = [e["data"] for e in of(run, GROUP_LEFT) if e["data"]["group"] == 0]
    assert left[0]["cause"] == "notice", left
    assert "tgnb: replica group 0 left at step" in log, log[-3000:]
    # the survivor never restarted; the replacement healed from it, with no checkpoint loaded
    groups = [(e["data"]["group"], e["data"]["replacement"]) for e in of(run, GROUP_JOINED)]
    assert groups.count((1, False)) == 1 and groups[2:] == [(0, True)], groups
    alone = [e for e in of(run, QUORUM_CHANGED) if e["data"]["groups"] == [1]]
    assert alone and alone[-1]["data"]["step"] >= 20, of(run, QUORUM_CHANGED)
    healed = [e["data"] for e in of(run, GROUP_HEALED) if e["data"]["group"] == 0]
    assert healed and healed[-1]["source"] == 1 and healed[-1]["step"] >= 20, healed
    mine = [s for s in steps(run) if s.get("group") == 0]
    second = [i for i, s in enumerate(mine) if "started" in s][1]  # the replacement's start
    before = [s["step"] for s in mine[:second] if "step" in s]
    after = [s["step"] for s in mine[second:] if "step" in s]
    assert after[0] > before[-1] >= 20, (before[-3:], after[:3])
    program = [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]
    assert not [e for e in program if e["reason"] == RUN_RESUMED], "a checkpoint was loaded"
    # every step once: the committed steps of each group rise one by one; the rows hold 1..N once
    last = int(ENV["FT_STEPS"])
    theirs = [s["step"] for s in steps(run) if s.get("group") == 1 and s.get("committed")]
    assert theirs == list(range(theirs[0], last + 1)), theirs[:5]  # from where it began
    rows = [json.loads(line)["step"] for line in (run.run_dir / "metrics.jsonl").open()]
    assert sorted(rows) == list(range(1, last + 1)), Counter(rows).most_common(3)
    # the periodic checkpoints are one group's: never two saves of one step
    saved = [e["data"]["step"] for e in program if e["reason"] == "CheckpointSaved"]
    assert saved and len(saved) == len(set(saved)) and max(saved) == last, saved
    assert events(run)  # the engine's record was read
