"""`tgnb certify` on the user's own programs (tests/certify/workdir: a plain loop with the
Checkpointer, broken four ways by ``--defect``, also run as a ``--command``; a Lightning script,
with and without protect; TRL's SFTTrainer with protect, tests/session/user_workdir; the
Checkpointer's DDP script on 2 nodes, shrunk to 1): each certified for real on the local emulator
(real preemptions through it, a real SIGKILL, torch, TRL and Lightning on the CPU), the right ones
passed, the broken ones refused with their defect named. Nothing is faked."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.session.test_user_code import _workdir as user_workdir
from tgnb.certify import Certificate
from tgnb.certify.cli import main
from tgnb.errors import ValidationError
from tgnb.session import Session

WORKDIR = Path(__file__).parent / "workdir"
DDP_LOOP = Path(__file__).parents[1] / "train" / "checkpoint"
LOOP = ["--max-steps", "80"]


def certify(session: Session, script: str, *args: str) -> Certificate:
    cert = session.certify(script, args=list(args), workdir=WORKDIR, seed=3, budget_s=400)
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
    bad = certify(session, "loop.py", *LOOP, "--defect", defect)
    assert not bad.safe and bad.exit_code == 1, (defect, str(bad))
    assert bad.findings and bad.findings[0].defect.startswith(named), (defect, str(bad))


@pytest.mark.slow
def test_a_protected_lightning_script_is_certified(session: Session) -> None:
    good = certify(session, "lit.py", "--max-steps", "300")
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
                 "--events", "first-save,kill"])  # fmt: skip
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert f"\ntgnb certify {line}: SAFE" in out, out  # after the emulator's start line
    assert out.count("  done      ") == 2 and "final state: bitwise" in out, out


def test_certify_refuses_bad_input(session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError, match="budget_s must be above 0"):
        session.certify("loop.py", workdir=WORKDIR, budget_s=0)
    with pytest.raises(ValidationError, match="is not in the workdir"):
        session.certify("nosuch.py", workdir=WORKDIR)
    with pytest.raises(ValidationError, match="no certify event 'reboot'"):
        session.certify("loop.py", workdir=WORKDIR, events=["reboot"])
    with pytest.raises(ValidationError, match="min_nodes must be from 1 to nodes"):
        session.certify("loop.py", workdir=WORKDIR, nodes=2, min_nodes=3)
    assert session.runs() == []  # nothing launched
    assert main([]) == 2 and "give a script or --command" in capsys.readouterr().err
