"""The checks of a fault-tolerant program's certificate (`tgnb.certify.groups`) on plain lists of
events and quorums, as the local engine and the lighthouse write them: a story where every check
holds, then the same story broken one way at a time (a survivor restarted, a step trained twice,
a replacement that loaded a checkpoint, a stall past the heartbeat timeout, a run that ended
short or failed), each check failing with its one-line reason; and the refusal of bad input."""

from __future__ import annotations

import importlib.util
from datetime import datetime, timedelta, timezone
from importlib.machinery import ModuleSpec
from typing import Any

import pytest

from tgnb.backends.local.quorums import Quorum
from tgnb.certify import Certificate, Finding
from tgnb.certify import groups as g
from tgnb.certify.chaos import Fired
from tgnb.certify.core import check_fault_tolerance
from tgnb.certify.state import StateMatch
from tgnb.certify_cli import main
from tgnb.errors import ValidationError
from tgnb.events import (
    GROUP_HEALED,
    GROUP_JOINED,
    GROUP_LEFT,
    LIGHTHOUSE_STARTED,
    QUORUM_CHANGED,
    RUN_RESUMED,
    Event,
)

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


def at(s: float) -> float:
    return (T0 + timedelta(seconds=s)).timestamp()


def ev(s: float, reason: str, src: str = "tgnb", node: str | None = None, **data: Any) -> Event:
    return Event(T0 + timedelta(seconds=s), src, reason, reason, node=node, run="r", data=data)


def quorum(i: int, s: float, **steps: int) -> Quorum:
    """Quorum `i` created at `s` s of groups (``g0=step``)."""
    return Quorum(i, {f"group_{k[1:]}:uuid{k}": v for k, v in steps.items()}, at(s))


def ref_quorums() -> list[Quorum]:
    return [quorum(i, 5 + 0.1 * i, g0=i, g1=i) for i in range(100)]  # a step every 0.1 s


def story() -> tuple[list[Fired], list[Event], list[Quorum]]:
    """Group 1 killed at 10 s (step 48): the survivor goes on alone after 2.3 s, a replacement
    starts at 14 s and heals from group 0 at step 60; both train to step 99."""
    fired = [Fired("kill", "kill of group 1", at(10), at_step=48, group=1)]
    evs = [
        ev(0, LIGHTHOUSE_STARTED, heartbeat_timeout_ms=2000, join_timeout_ms=1000),
        ev(1, GROUP_JOINED, node="n0", group=0, replacement=False),
        ev(1, GROUP_JOINED, node="n1", group=1, replacement=False),
        ev(5, QUORUM_CHANGED, groups=[0, 1], step=0, waited_s=0.0),
        ev(10.2, GROUP_LEFT, group=1, cause="lost", exit_code=-9),
        ev(12.4, QUORUM_CHANGED, groups=[0], step=48, waited_s=2.3),
        ev(14, GROUP_JOINED, node="n1", group=1, replacement=True),
        ev(18, GROUP_HEALED, group=1, step=60, source=0, took_s=4.0, from_step=0),
        ev(18, QUORUM_CHANGED, groups=[0, 1], step=60, waited_s=0.1),
        ev(22, GROUP_LEFT, group=0, cause="finished", exit_code=0),
        ev(22, GROUP_LEFT, group=1, cause="finished", exit_code=0),
    ]
    qs = [quorum(i, 5 + 0.1 * i, g0=i, g1=i) for i in range(49)]
    qs += [quorum(49, 12.4, g0=48)] + [quorum(50 + i, 12.5 + 0.1 * i, g0=49 + i) for i in range(11)]
    qs += [quorum(61, 18, g0=60, g1=0)] + [quorum(62 + i, 18.1 + 0.1 * i, g0=61 + i, g1=61 + i)
                                           for i in range(39)]  # fmt: skip
    return fired, evs, qs


def checks(fired: list[Fired], evs: list[Event], qs: list[Quorum], twice: int = 0,
           state: str = "succeeded") -> dict[str, g.Check]:  # fmt: skip
    out = g.check(fired, evs, qs, ref_quorums(), twice, state, "succeeded")
    return {c.name: c for c in out}


def failed(found: dict[str, g.Check]) -> list[str]:
    return [name for name, c in found.items() if not c.ok]


def test_every_check_holds_for_a_group_that_left_and_healed() -> None:
    found = checks(*story())
    assert not failed(found), found
    assert found["each step trained once"].detail.endswith(
        "reached 99, as the uninterrupted run (99)"
    )
    assert found["no surviving group restarted"].detail == "kill: group 1 left, 0 trained on"
    heal = found["replacement healed from a live peer, no checkpoint loaded"].detail
    assert heal == "group 1 healed from group 0 at step 60, 4.0 s after it started", heal
    stall = found["survivors' stall"].detail  # bound: 2 + 1 + 3 s slack + 5 steps of 0.1 s
    assert stall == "kill: 2.3 s at step 48 (heartbeat timeout 2.0 s, bound 6.5 s)", stall


def test_a_survivor_that_restarted_fails() -> None:
    fired, evs, qs = story()
    evs += [ev(11, GROUP_LEFT, group=0, cause="lost", exit_code=1),
            ev(13, GROUP_JOINED, node="n0", group=0, replacement=True)]  # fmt: skip
    found = checks(fired, evs, qs)
    assert failed(found) == ["no surviving group restarted"], found
    assert found["no surviving group restarted"].detail == (
        "group 0 left (lost, exit 1) though no event hit it: a surviving group restarted"
    )


def test_a_step_trained_twice_fails() -> None:
    """The whole run started again from step 0 after the kill (a restart, not a heal)."""
    fired, evs, qs = story()
    qs = qs[:49] + [quorum(49 + i, 14 + 0.1 * i, g0=i, g1=i) for i in range(100)]
    found = checks(fired, evs, qs)
    assert "each step trained once" in failed(found), found
    assert found["each step trained once"].detail == (
        "a step trained twice: the quorum's step went back from 48 to 0 (quorum 49), steps "
        "1..48 trained again"
    )
    assert not checks(*story(), twice=3)["each step trained once"].ok  # logged twice by the hook


def test_a_replacement_that_loaded_a_checkpoint_fails() -> None:
    fired, evs, qs = story()
    name = "replacement healed from a live peer, no checkpoint loaded"
    loaded = [*evs, ev(15, RUN_RESUMED, "run", step=40)]
    found = checks(fired, loaded, qs)
    assert failed(found) == [name] and "loaded a checkpoint (RunResumed)" in found[name].detail
    own = [e if e.reason != GROUP_HEALED else ev(18, GROUP_HEALED, group=1, step=60, source=0,
                                                  took_s=4.0, from_step=40) for e in evs]  # fmt: skip
    detail = checks(fired, own, qs)[name].detail
    assert detail == "group 1's replacement entered the quorum at step 40, not 0: it loaded " \
        "state of its own before healing", detail  # fmt: skip
    never = [e for e in evs if e.reason != GROUP_HEALED]
    qs_never = [q for q in qs if q.created < at(18)]
    assert checks(fired, never, qs_never)[name].detail == (
        "group 1's replacement never entered a quorum"
    )


def test_a_stall_past_the_heartbeat_timeout_fails() -> None:
    fired, evs, qs = story()
    slow = [e if e.reason != QUORUM_CHANGED or e.data["groups"] != [0]
            else ev(40, QUORUM_CHANGED, groups=[0], step=48, waited_s=31.0) for e in evs]  # fmt: skip
    found = checks(fired, slow, qs)
    assert failed(found) == ["survivors' stall"], found
    assert found["survivors' stall"].detail == (
        "after the kill event the survivors waited 31.0 s for a quorum without group 1, more than "
        "the lighthouse's heartbeat timeout (2.0 s) explains (bound 6.5 s)"
    )
    bare = [e for e in evs if e.reason != LIGHTHOUSE_STARTED]
    assert "no LighthouseStarted" in checks(fired, bare, qs)["survivors' stall"].detail


def test_a_run_that_ended_short_or_failed_fails() -> None:
    fired, evs, qs = story()
    short = checks(fired, evs, qs[:-20])
    assert failed(short) == ["each step trained once"], short
    assert short["each step trained once"].detail == (
        "the run's quorums stopped at step 79, the uninterrupted run's reached 99"
    )
    found = checks(fired, evs, qs, state="failed")
    assert failed(found) == ["finished as the uninterrupted run"], found


def test_the_certificate_says_which_checks_it_used_and_why_no_parameters() -> None:
    fired, evs, qs = story()
    made = g.check(fired, evs, qs, ref_quorums(), 0, "succeeded", "succeeded")
    cert = Certificate("train_ft.py", fired, [None], 0, StateMatch("not compared", g.NOT_COMPARED),
                       checks=made, not_done=[("shrink", "not for replica groups: ...")])  # fmt: skip
    text = str(cert)
    assert cert.safe and "SAFE" in text.splitlines()[0], text
    assert "checks (fault-tolerant):\n  ok    each step trained once: " in text, text
    assert f"final parameters: not compared ({g.NOT_COMPARED})" in text, text
    assert "  NOT DONE  shrink: not for replica groups" in text, text
    bad = g.check(fired, evs, qs[:-20], ref_quorums(), 0, "succeeded", "succeeded")
    broken = Certificate("train_ft.py", fired, [None], 0, StateMatch("not compared", ""),
                         checks=bad, findings=[Finding(f"{c.name}: {c.detail}", c.fix)
                                               for c in bad if not c.ok])  # fmt: skip
    assert not broken.safe and broken.exit_code == 1 and "NOT SAFE" in str(broken), str(broken)
    assert "  FAIL  each step trained once: the run's quorums stopped at step 79" in str(broken)


def test_bad_fault_tolerant_input_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, said in [
        (("torchftt", 2, None), "fault_tolerance must be 'torchft' or left out, not 'torchftt'"),
        (("torchft", 1, None), "needs nodes=2 or more, one replica group per node"),
        (("torchft", 2, 1), r"drop min_nodes \(--min-nodes\)"),
    ]:
        with pytest.raises(ValidationError, match=said):
            check_fault_tolerance(*args)
    check_fault_tolerance(None, 1, None)  # not fault-tolerant: nothing to refuse
    assert main(["--fault-tolerance", "torchft", "t.py"]) == 2  # before any emulator starts
    err = capsys.readouterr().err
    assert err.startswith("tgnb certify: fault_tolerance='torchft' needs nodes=2") and (
        err.count("\n") == 1
    ), err
    real = importlib.util.find_spec

    def without_torchft(name: str, *a: Any) -> ModuleSpec | None:
        return None if name == "torchft" else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", without_torchft)  # a Python without it
    with pytest.raises(ValidationError, match=r"needs the torchft package .* pip install"):
        check_fault_tolerance("torchft", 2, None)
