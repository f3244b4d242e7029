"""`tgnb certify` of a fault-tolerant program (``fault_tolerance="torchft"``, issue 50): the plain
TorchFT program of tests/backends/ft_workdir/train_ft.py (it never imports tgnb) certified for
real as two replica groups on the local emulator (a real lighthouse, real processes, gloo; a group
preempted during setup, one preempted with notice, one SIGKILLed), its certificate's checks held
against what the runs wrote: the engine's records and the program's own log lines."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tgnb.certify import Certificate
from tgnb.certify.groupchaos import quorums
from tgnb.events import GROUP_HEALED, GROUP_JOINED, GROUP_LEFT
from tgnb.runs.run import Run
from tgnb.session import Session

pytest.importorskip("torchft")
FT_WORKDIR = Path(__file__).parents[1] / "backends" / "ft_workdir"
#: one of the program's lines: a flat JSON object
LINE = re.compile(r'\{"group": [^{}]*\}')


def lines(run: Run) -> list[dict[str, Any]]:
    """The program's own lines (one JSON object a step, one at each start) in the run's log."""
    assert run.run_dir is not None
    text = (run.run_dir / "train.log").read_text(errors="replace")
    out = []
    for found in LINE.finditer(text):  # another process's output may share its line
        with contextlib.suppress(ValueError):  # one cut short
            out.append(json.loads(found.group()))
    return out


#: the program's steps: room for a replacement to start and heal after the kill (a replacement
#: took 17-23 s to start under a load of 7 on two cores, 250 steps of the survivor's)
STEPS = 1500


def certify(session: Session) -> Certificate:
    env = {"FT_STEPS": str(STEPS), "FT_STEP_S": "0.05"}
    cert = session.certify("train_ft.py", workdir=FT_WORKDIR, nodes=2, fault_tolerance="torchft",
                           seed=5, budget_s=800, env=env)  # fmt: skip
    print(cert)
    return cert


@pytest.mark.slow
@pytest.mark.training
def test_a_plain_torchft_program_is_certified_as_replica_groups(session: Session) -> None:
    cert = certify(session)
    assert cert.safe and cert.exit_code == 0, str(cert)
    done = [ev for ev in cert.events if ev.done]
    assert [ev.kind for ev in done] == ["setup", "random-step", "kill"], str(cert)
    assert cert.checks is not None and [c.ok for c in cert.checks] == [True] * 5, str(cert)
    text = str(cert)
    assert "checks (fault-tolerant):" in text and "final parameters: not compared" in text, text
    assert "NOT DONE  first-save: not for replica groups" in text, text
    assert "NOT DONE  shrink: not for replica groups" in text, text
    assert cert.runs is not None
    ref, run = session.run(cert.runs[0]), session.run(cert.runs[1])
    evs = run.run_events()
    # each event's group left, and its replacement healed from the other group: the heals the
    # certificate names are the engine's GroupHealed records
    healed = next(c for c in cert.checks if c.name.startswith("replacement healed"))
    for ev in done:
        assert ev.group in (0, 1)
        left = [e for e in evs if e.reason == GROUP_LEFT and e.data["group"] == ev.group
                and e.time.timestamp() >= (ev.fired_at or 0)]  # fmt: skip
        assert left, (ev, evs)
        heal = [e.data for e in evs if e.reason == GROUP_HEALED and e.data["group"] == ev.group
                and e.time >= left[0].time]  # fmt: skip
        if heal:  # after setup, the replacement may have entered at step 0 with its peer
            assert heal[0]["source"] == 1 - ev.group and heal[0]["from_step"] == 0, heal
            said = f"group {ev.group} healed from group {1 - ev.group} at step {heal[0]['step']}"
            assert said in healed.detail, (said, healed.detail)
        else:
            assert ev.kind == "setup", (ev, healed.detail)
    # no survivor restarted: one start per group and one per event, in the engine's records
    starts = [e.data["group"] for e in evs if e.reason == GROUP_JOINED]
    assert len(starts) == 2 + len(done), starts
    mine = lines(run)
    for g in (0, 1):  # the program's own lines: a start for each of the engine's (a group
        # preempted during setup may be gone before it printed), its steps never going back
        early = sum(1 for ev in done if ev.kind == "setup" and ev.group == g)
        printed = sum(1 for s in mine if s.get("group") == g and "started" in s)
        assert starts.count(g) - early <= printed <= starts.count(g), (g, printed, starts)
    for heal in (e for e in evs if e.reason == GROUP_HEALED):
        # the replacement's first step in its own log follows the step it healed at: it took the
        # peer's weights there, it did not train from step 0
        g, at = heal.data["group"], heal.time.timestamp()
        segment: list[dict[str, Any]] = []
        for s in (s for s in mine if s.get("group") == g):
            if "started" in s:
                if s["started"] > at:
                    break
                segment = []
            segment.append(s)
        first = next(s["step"] for s in segment if "step" in s)
        assert heal.data["step"] <= first <= heal.data["step"] + 1, (heal.data, segment[:3])
    # the run reached the uninterrupted run's last step; the quorum's step never went back
    last = max(s["done"] for s in mine if "done" in s)
    assert last == max(s["done"] for s in lines(ref) if "done" in s) == STEPS
    qs = [q.step for q in quorums(run.run_dir)]
    assert qs == sorted(qs), qs
    assert f"reached {max(qs)}" in cert.checks[0].detail, cert.checks[0]
