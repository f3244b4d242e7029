"""`tgnb certify` of a fault-tolerant program (``fault_tolerance="torchft"``, issue 50): the plain
TorchFT program of tests/backends/ft_workdir/train_ft.py (it never imports tgnb) certified for
real as two replica groups on the local emulator (a real lighthouse, real processes, gloo; a group
preempted during setup, one preempted with notice, one SIGKILLed), its certificate's checks held
against what the runs wrote: the engine's records and the program's own log lines. The same loop
on torchft's DistributedDataParallel (tests/certify/ft_workdir/train_ft_ddp.py), whose survivor
crashes when its peer is lost, is refused with the survivor's restart named."""

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
BROKEN = Path(__file__).parent / "ft_workdir"  # train_ft_ddp.py: its survivor crashes
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
    for rec in (e for e in evs if e.reason == GROUP_HEALED):
        # the replacement's first step in its own log follows the step it healed at: it took the
        # peer's weights there, it did not train from step 0
        g, at = rec.data["group"], rec.time.timestamp()
        segment: list[dict[str, Any]] = []
        for s in (s for s in mine if s.get("group") == g):
            if "started" in s:
                if s["started"] > at:
                    break
                segment = []
            segment.append(s)
        first = next(s["step"] for s in segment if "step" in s)
        assert rec.data["step"] <= first <= rec.data["step"] + 1, (rec.data, segment[:3])
    # the run reached the uninterrupted run's last step; the quorum's step never went back
    last = max(s["done"] for s in mine if "done" in s)
    assert last == max(s["done"] for s in lines(ref) if "done" in s) == STEPS
    qs = [q.step for q in quorums(run.run_dir)]
    assert qs == sorted(qs), qs
    assert f"reached {max(qs)}" in cert.checks[0].detail, cert.checks[0]


@pytest.mark.slow
@pytest.mark.training
def test_a_program_whose_survivor_crashes_is_refused(session: Session) -> None:
    env = {"FT_STEPS": "500", "FT_STEP_S": "0.05"}
    cert = session.certify("train_ft_ddp.py", workdir=BROKEN, nodes=2, fault_tolerance="torchft",
                           seed=7, budget_s=600, env=env, events=["random-step", "kill"])  # fmt: skip
    print(cert)
    assert not cert.safe and cert.exit_code == 1 and "NOT SAFE" in str(cert), str(cert)
    assert cert.checks is not None and cert.runs is not None
    found = {c.name: c for c in cert.checks}
    survivors = found["no surviving group restarted"]
    assert not survivors.ok, str(cert)
    m = re.fullmatch(r"group (\d) left \((\w+), exit (-?\d+)\) though no event hit it: a "
                     r"surviving group restarted", survivors.detail)  # fmt: skip
    assert m is not None, survivors.detail
    crashed = int(m.group(1))
    assert any(f.defect == f"no surviving group restarted: {survivors.detail}" and
               "must not exit when a peer is lost" in f.fix for f in cert.findings), cert.findings  # fmt: skip
    # what happened: the engine recorded the survivor's leaving, after an event that hit the
    # other group; with both groups gone, the run's steps went back: the quorum's, and the
    # steps the program itself logged (some printed again after a higher one)
    run = session.run(cert.runs[1])
    evs = run.run_events()
    hit = [ev for ev in cert.events if ev.done]
    gone = next(e for e in evs if e.reason == GROUP_LEFT and e.data["group"] == crashed
                and e.data["cause"] == m.group(2))  # fmt: skip
    before = [ev for ev in hit if (ev.fired_at or 0) <= gone.time.timestamp()]
    assert before and before[-1].group == 1 - crashed, (before, gone)
    assert str(gone.data["exit_code"]) == m.group(3)
    back = found["each step trained once"]
    assert not back.ok and "a step trained twice: the quorum's step went back" in back.detail
    steps = [s["step"] for s in lines(run) if "step" in s]
    assert any(step + 1 < max(steps[:i]) for i, step in enumerate(steps) if i), steps
