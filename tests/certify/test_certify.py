"""`tgnb certify` on the user's own programs (tests/certify/workdir: a plain loop with the
Checkpointer, broken four ways by ``--defect``; a Lightning script, with and without protect):
each certified for real on the local emulator (real preemptions through it, a real SIGKILL,
torch and Lightning on the CPU), the right ones passed bit for bit, the broken ones refused with
their defect named. Nothing is faked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.certify import Certificate
from tgnb.certify.cli import main
from tgnb.errors import ValidationError
from tgnb.session import Session

WORKDIR = Path(__file__).parent / "workdir"
LOOP = ["--max-steps", "80"]


def certify(session: Session, script: str, *args: str) -> Certificate:
    cert = session.certify(script, args=list(args), workdir=WORKDIR, seed=3, budget_s=400)
    print(cert)
    return cert


@pytest.mark.slow
def test_a_checkpointer_loop_is_certified_and_its_defects_named(session: Session) -> None:
    good = certify(session, "loop.py", *LOOP)
    assert good.safe and good.exit_code == 0, good
    assert [ev.kind for ev in good.events if ev.done] == ["setup", "first-save", "random-step",
                                                          "kill"]  # fmt: skip
    assert good.state.verdict == "bitwise", good.state
    notice = [lost for lost, ev in zip(good.lost, good.events, strict=True) if ev.kind != "kill"]
    assert all(lost is not None and lost[1] <= 1 for lost in notice), good
    assert "NOT DONE  shrink" in str(good)
    for defect, named in [
        ("data", "data position not saved"),
        ("rng", "RNG not restored"),
        ("exit0", "exits 0 on SIGTERM"),
        ("nohook", "no hook"),
    ]:
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


def test_certify_refuses_bad_input(session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError, match="budget_s must be above 0"):
        session.certify("loop.py", workdir=WORKDIR, budget_s=0)
    with pytest.raises(ValidationError, match="is not in the workdir"):
        session.certify("nosuch.py", workdir=WORKDIR)
    assert session.runs() == []  # nothing launched
    assert main([]) == 2 and "give a script or --command" in capsys.readouterr().err
