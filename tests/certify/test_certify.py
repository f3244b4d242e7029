"""`tgnb certify` on the user's own programs (tests/certify/workdir: a plain loop with the
Checkpointer, broken four ways by ``--defect``, also run as a ``--command``; a Lightning script,
with and without protect; TRL's SFTTrainer with protect, tests/session/user_workdir; the
Checkpointer's DDP script on 2 nodes, shrunk to 1): each certified for real on the local emulator
(real preemptions through it, a real SIGKILL, torch, TRL and Lightning on the CPU), the right ones
passed, the broken ones refused with their defect named. Nothing is faked."""

from __future__ import annotations

import shutil
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.session.projects import user_workdir
from tgnb.backends.base import RunSpec
from tgnb.certify import Certificate, report
from tgnb.certify.chaos import Fired
from tgnb.certify.core import run_stem
from tgnb.certify.state import StateMatch
from tgnb.certify_cli import main
from tgnb.errors import ValidationError
from tgnb.events import CHECKPOINT_INTERVAL, Event
from tgnb.notebook.timeline import timeline
from tgnb.server.serialize import run_json
from tgnb.session import Session

WORKDIR = Path(__file__).parent / "workdir"
DDP_LOOP = Path(__file__).parents[1] / "train" / "checkpoint"
LOOP = ["--max-steps", "80"]


def certify(
    session: Session, script: str, *args: str, events: list[str] | None = None
) -> Certificate:
    cert = session.certify(
        script, args=list(args), workdir=WORKDIR, seed=3, budget_s=400, events=events
    )
    print(cert)
    return cert


@pytest.mark.slow
def test_a_checkpointer_loop_is_certified(session: Session) -> None:
    good = certify(session, "loop.py", *LOOP)
    assert good.safe and good.exit_code == 0, good
    assert [ev.kind for ev in good.events if ev.done] == ["setup", "first-save", "random-step",
                                                          "kill"]  # fmt: skip
    assert good.state.verdict == "bitwise", good.state
    notice = [lost for lost, ev in zip(good.lost, good.events, strict=True) if ev.kind != "kill"]
    assert all(lost is not None and lost[1] <= 1 for lost in notice), good
    assert "NOT DONE  shrink" in str(good)
    # the program's own policy, as a launch runs it (auto), not an interval of certify's: the
    # certificate says what a kill risks, and the kill lost no more than announced before it
    assert good.save_every is None and good.risk is not None and good.risk.rule == "auto", good
    kill = good.events.index(next(ev for ev in good.events if ev.kind == "kill"))
    told, lost = good.told[kill], good.lost[kill]
    assert told is not None and lost is not None and lost[1] <= told.steps + 1, str(good)
    assert f"a real launch risks: up to {good.risk} lost to a kill with no notice" in str(good)
    # every interval announced is in the events the sidebar reads and on the run's timeline
    assert good.runs is not None
    run = session.run(good.runs[1])
    events = [e for e in run_json(run, detail=True)["events"] if e["reason"] == CHECKPOINT_INTERVAL]
    assert len(events) >= 2 and all("node-hours" not in e["message"] for e in events), events
    root = ET.fromstring(timeline(run).to_svg())
    tips = " ".join("".join(u.itertext()) for u in root.iter("{http://www.w3.org/2000/svg}use"))
    for e in events:
        assert e["message"].split(":")[0] in tips, (e["message"], tips)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("defect", "named"),
    [
        ("data", "data position not saved"),
        ("rng", "RNG not restored"),
        ("exit0", "exits 0 on SIGTERM"),
        ("nohook", "no hook"),
    ],
)
def test_a_broken_checkpointer_loop_is_refused_with_its_defect_named(
    session: Session, defect: str, named: str
) -> None:
    # one preemption with notice at a random step shows each defect (the loop test drives the
    # whole schedule; the others' restarts would only add to this run's cost)
    bad = certify(session, "loop.py", *LOOP, "--defect", defect, events=["random-step"])
    assert not bad.safe and bad.exit_code == 1, (defect, str(bad))
    assert bad.findings and bad.findings[0].defect.startswith(named), (defect, str(bad))
    if defect == "rng":
        assert "DataLoader" not in str(bad), str(bad)


@pytest.mark.slow
def test_a_dataloader_with_no_generator_is_named_as_the_cause(session: Session) -> None:
    """A DataLoader whose shuffle seed is drawn from the global RNG (no ``generator=``): the
    loop draws from the global RNG already, so the fix is the DataLoader's generator, not that."""
    bad = certify(session, "loader.py", *LOOP, events=["random-step"])
    assert not bad.safe and bad.exit_code == 1, str(bad)
    (found,) = bad.findings
    assert found.defect.startswith("RNG not restored: the DataLoader has no generator="), str(bad)
    assert "generator=torch.Generator().manual_seed(seed)" in found.fix, str(bad)
    assert "global RNG (tgnb restores it)" not in str(bad), str(bad)


@pytest.mark.slow
def test_a_protected_lightning_script_is_certified(session: Session) -> None:
    """With certify's own interval (``save_every``): under the program's policy (``auto``, a
    save about every 28 s) the first save of a 300-step run came at step 100 on a loaded machine
    and at step 278 on a quiet one, leaving no steps for the kill with no notice ("the run had
    succeeded first": NOT CERTIFIED by the machine's speed, not by the program)."""
    good = session.certify("lit.py", args=["--max-steps", "300"], workdir=WORKDIR, seed=3,
                           budget_s=400, save_every=100)  # fmt: skip
    print(good)
    assert good.safe, good
    assert good.state.verdict == "bitwise", good.state


@pytest.mark.slow
def test_a_lightning_script_without_protect_is_refused(session: Session) -> None:
    bad = certify(session, "lit.py", "--max-steps", "300", "--no-protect")
    assert not bad.safe and bad.exit_code == 1
    assert bad.findings[0].defect.startswith("Lightning Trainer without protect"), str(bad)
    assert "protect(trainer)" in bad.findings[0].fix


@pytest.mark.slow
def test_a_ddp_checkpointer_script_is_certified_through_a_shrink(
    session: Session, tmp_path: Path
) -> None:
    """The DDP/FSDP test script of the Checkpointer (tests/train/checkpoint/loop_script.py: the
    same global batch at any world size) on 2 nodes, allowed to shrink to 1, certified on the
    kill (the launcher's workers die too) and the shrink (a 2-node attempt starts slowly here;
    the loop test drives the other events):
    a node preempted whose replacement is not granted, the run resumes on 1 node and ends where
    the uninterrupted 2-node run ends. The script is certified from a folder of its own, as a user
    has it (its test folder holds other tests' fake keys, which a launch refuses to ship)."""
    workdir = tmp_path / "ddp"
    workdir.mkdir()
    shutil.copy(DDP_LOOP / "loop_script.py", workdir)
    cert = session.certify("loop_script.py", args=["--dir", "out", "--steps", "30", "--sleep",
                           "0.05"], workdir=workdir, seed=3, budget_s=400, nodes=2, min_nodes=1,
                           events=["kill", "shrink"])  # fmt: skip
    print(cert)
    assert [ev.kind for ev in cert.events] == ["kill", "shrink"]  # the others: the loop test's
    shrink = cert.events[-1]
    assert shrink.done and "resumed on 1 of 2 nodes" in shrink.note, str(cert)
    lost = cert.lost[-1]
    assert lost is not None and lost[1] <= 1, str(cert)
    assert cert.safe and cert.state.ok, str(cert)
    assert "NOT DONE  setup: left out (events=...)" in str(cert)
    assert session.status().desired_preemptible_gpus == 16  # the target raised for it is back


@pytest.mark.slow
def test_a_trl_trainer_with_protect_is_certified(session: Session, tmp_path: Path) -> None:
    """TRL's SFTTrainer quickstart plus protect (tests/session/user_workdir) on the built-in tiny
    model, under a preemption with notice at a random step and a kill with no notice (the loop test
    drives the whole schedule; two events keep this TRL run's cost down)."""
    from tgnb.tasks import assets

    workdir = user_workdir(tmp_path)
    cert = session.certify("train.py", args=["--model", assets.resolve_model("tiny"),
                           "--max-steps", "40"], workdir=workdir, seed=3, budget_s=500,
                           events=["random-step", "kill"])  # fmt: skip
    print(cert)
    assert cert.safe and cert.exit_code == 0, str(cert)
    assert [ev.kind for ev in cert.events] == ["random-step", "kill"], str(cert)


@pytest.mark.slow
def test_a_command_is_certified_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """``tgnb certify --command ...`` as a user types it: the Checkpointer loop started by a
    command of its own (not a script tgnb launches), on a fresh emulator the CLI starts and stops."""
    line = f"{sys.executable} loop.py --max-steps 60"
    code = main(["--command", line, "--workdir", str(WORKDIR), "--seed", "3", "--budget-s", "400",
                 "--events", "first-save,kill", "--save-every", "5"])  # fmt: skip
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert f"\ntgnb certify {line}: SAFE" in out, out  # after the emulator's start line
    assert out.count("  done      ") == 2 and "final state: bitwise" in out, out
    assert "within the interval announced before it: 5 steps" in out, out
    assert "a real launch risks: up to 5 steps" in out and "with --save-every 5, certify's " \
        "setting, not the program's own policy" in out, out  # fmt: skip


def test_certify_refuses_bad_input(session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError, match="budget_s must be a number of seconds above 0"):
        session.certify("loop.py", workdir=WORKDIR, budget_s=0)
    with pytest.raises(ValidationError, match="is not in the workdir"):
        session.certify("nosuch.py", workdir=WORKDIR)
    with pytest.raises(ValidationError, match="no certify event 'reboot'"):
        session.certify("loop.py", workdir=WORKDIR, events=["reboot"])
    with pytest.raises(ValidationError, match="min_nodes must be from 1 to nodes"):
        session.certify("loop.py", workdir=WORKDIR, nodes=2, min_nodes=3)
    with pytest.raises(ValidationError, match="save_every must be a whole number of steps"):
        session.certify("loop.py", workdir=WORKDIR, save_every=0)
    with pytest.raises(ValidationError, match="budget_s must be a number of seconds above 0"):
        session.certify("loop.py", workdir=WORKDIR, budget_s=float("nan"))  # it never ran out
    with pytest.raises(ValidationError, match=r"is outside the workdir .*: move it into the"):
        session.certify("../conftest.py", workdir=WORKDIR)  # it exists, outside
    assert session.runs() == []  # nothing launched
    assert main([]) == 2 and "give a script or --command" in capsys.readouterr().err
    for argv, said in [
        (["--command", "python 'ok.py"], "cannot be split as a shell would: No closing quotation"),
        (["--budget-s", "nan", "loop.py"], "--budget-s must be a number of seconds above 0"),
        (["--budget-s", "-5", "loop.py"], "--budget-s must be a number of seconds above 0"),
    ]:
        assert main(argv) == 2, argv  # the usage exit, before any emulator is started
        err = capsys.readouterr().err
        assert err.startswith("tgnb certify: ") and said in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("script", "stem"),
    [("train.v2.py", "train-v2"), ("my train.py", "my-train"), ("Über_Lauf!.py", "ber-lauf")],
)
def test_certify_names_its_runs_validly_whatever_the_script_is_called(
    script: str, stem: str
) -> None:
    assert run_stem(script, None) == stem
    for name in (f"certify-{stem}-ref-0a1b2c", f"certify-{stem}-chaos-0a1b2c"):
        assert RunSpec(name=name, train={"algorithm": "grpo"}).name == name  # valid: built


def test_the_certificate_states_the_interval_a_launch_risks_and_refuses_a_kill_past_it() -> None:
    """The certificate reads the intervals the program announced (``CheckpointIntervalChosen``):
    beside the kill, the one announced before it; the uninterrupted run's last as what a real
    launch risks. A kill that lost more than its interval (plus the step in progress), as the
    old schedule's did (238 steps against 140 told), is NOT CERTIFIED."""
    t0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)

    def told(s: float, steps: int, secs: float, source: str = "run") -> Event:
        return Event(t0 + timedelta(seconds=s), source, CHECKPOINT_INTERVAL,
                     f"checkpoint every {steps} steps", run="r",
                     data={"every_steps": steps, "every_s": secs, "rule": "auto", "step": 3})  # fmt: skip

    evs = [told(1, 2, 0.1), told(2, 290, 14.5), told(30, 400, 20.0), told(31, 9, 0.5, "tgnb")]
    kill = Fired("kill", "kill with no notice (SIGKILL)", (t0 + timedelta(seconds=10)).timestamp(),
                 at_step=40)  # fmt: skip
    before = report.announced(evs, kill.fired_at)
    assert before is not None and (before.steps, before.seconds) == (290, 14.5)
    risk = report.announced(evs)  # the runtime's last: not the other source's
    assert risk is not None and risk.steps == 400

    def cert(lost: int, save_every: int | None = None) -> Certificate:
        return Certificate("loop.py", [kill], [(40, lost)], 0, StateMatch("bitwise", "equal"),
                           told=[before], risk=risk, save_every=save_every)  # fmt: skip

    good = cert(291)  # the interval and the step in progress
    assert good.safe and "291 step(s) lost, within the interval announced before it: 290 " \
        "steps (14 s)" in str(good), str(good)  # fmt: skip
    assert "\na real launch risks: up to 400 steps (20 s) lost to a kill with no notice (the " \
        "program's policy, auto, as a launch runs it)\n  announced at step 3 by the " \
        "uninterrupted run: checkpoint every 400 steps\n" in str(good), str(good)  # fmt: skip
    bad = cert(292)
    assert not bad.safe and bad.exit_code == 1 and bad.exceeded == [0], str(bad)
    assert "NOT CERTIFIED" in str(bad) and "MORE than the interval announced" in str(bad)
    assert "with --save-every 5, certify's setting, not the program's own policy" in str(
        cert(3, save_every=5)
    )
    none = Certificate("t.py", [kill], [(40, 40)], 0, StateMatch("bitwise", "equal"), told=[None])
    assert none.safe and "a real launch risks: unknown" in str(none), str(none)
