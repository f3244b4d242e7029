"""The checks of a fault-tolerant program's certificate (``certify(..., fault_tolerance=
"torchft")``): what a researcher expects of TorchFT replica groups on preemptible nodes, read from
what the two runs wrote — the engine's events (``GroupLeft``, ``GroupJoined``, ``GroupHealed``,
``QuorumChanged``, ``LighthouseStarted``, `tgnb.events`), the lighthouse's quorums
(`tgnb.backends.local.quorums`) and the metrics rows where the program calls tgnb's hook.

Why the final parameters are not compared with the uninterrupted run's (`NOT_COMPARED`): while a
group is away the survivors train its steps with fewer groups, an effective batch of another size,
so the parameters legitimately differ. Instead, for each event of the schedule
(`tgnb.certify.groupchaos`), five checks (`check`), each a `Check` with one line that says what held
or, when it fails, why:

- each step trained once: the quorum's step never goes back, the run reaches the uninterrupted
  run's last step, and no step is logged twice;
- no surviving group restarted: only the group an event hit left before the end;
- the replacement healed from a live peer and loaded no checkpoint: it entered the quorum at step
  0 and a peer's weights were sent to it (``GroupHealed``, from whom, at which step), and the run
  recorded no ``RunResumed``;
- the survivors' stall per event: the quorum's wait without the group (``QuorumChanged``'s
  ``waited_s``), within what the lighthouse's heartbeat and join timeouts announced in
  ``LighthouseStarted`` explain, with slack for a few step times (`stall_bound`);
- the run finished as the uninterrupted one did.

Pure functions of plain lists (events, quorums, rows): no I/O, so each check is tested on lists.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tgnb.backends.local.quorums import Quorum, group_of
from tgnb.certify.chaos import Fired
from tgnb.events import (
    GROUP_HEALED,
    GROUP_JOINED,
    GROUP_LEFT,
    LIGHTHOUSE_STARTED,
    QUORUM_CHANGED,
    RUN_RESUMED,
    Event,
)

if TYPE_CHECKING:
    from tgnb.certify.report import Certificate

NOT_COMPARED = (
    "replica groups: while a group is away the survivors train its steps with fewer groups "
    "(another effective batch), so the parameters legitimately differ from the uninterrupted "
    "run's; the fault-tolerant checks below certify it instead"
)
#: A group's leaving at the run's end, not a restart (`tgnb.backends.local.groups`' causes).
END_CAUSES = ("finished", "stopped", "budget", "moved")
#: Slack of the stall's bound: seconds, and step times of the uninterrupted run.
SLACK_S = 3.0
SLACK_STEPS = 5


@dataclass(frozen=True)
class Check:
    """One fault-tolerant check: `ok`, and a line of what held or, failed, why (`fix`: what to
    change)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def _at(e: Event) -> float:
    return e.time.timestamp()


def _of(evs: Sequence[Event], reason: str, group: int | None = None) -> list[Event]:
    return [
        e for e in evs if e.reason == reason and (group is None or e.data.get("group") == group)
    ]


def steps_once(qs: Sequence[Quorum], ref_qs: Sequence[Quorum], twice: int) -> Check:
    """The quorum's step never goes back; the last reaches the uninterrupted run's; no step is
    logged twice (`twice`: steps logged more than once in the metrics rows)."""
    name = "each step trained once"
    top, back = 0, None
    for q in qs:
        if q.step < top and back is None:
            back = (top, q)
        top = max(top, q.step)
    ref_last = max((q.step for q in ref_qs), default=0)
    fix = "a group that joins must heal from a peer (TorchFT's Manager with state_dict= and " \
        "load_state_dict=), not start again from step 0 or from a checkpoint"  # fmt: skip
    if back is not None:
        was, q = back
        return Check(name, False, f"a step trained twice: the quorum's step went back from {was} "
                     f"to {q.step} (quorum {q.quorum_id}), steps {q.step + 1}..{was} trained "
                     "again", fix)  # fmt: skip
    if top < ref_last:
        return Check(name, False, f"the run's quorums stopped at step {top}, the uninterrupted "
                     f"run's reached {ref_last}", "see the run's log for why it ended early")  # fmt: skip
    if twice:
        return Check(name, False, f"{twice} step(s) logged twice", fix)
    return Check(name, True, f"the quorum's step never went back ({len(qs)} quorums) and reached "
                 f"{top}, as the uninterrupted run ({ref_last})")  # fmt: skip


def _match(fired: Sequence[Fired], evs: Sequence[Event]) -> tuple[dict[int, Event], list[Event]]:
    """Each early ``GroupLeft`` matched to the event that hit its group (by index in `fired`),
    and those no event explains."""
    matched: dict[int, Event] = {}
    stray = []
    early = [e for e in _of(evs, GROUP_LEFT) if e.data.get("cause") not in END_CAUSES]
    for e in sorted(early, key=_at):
        i = next((i for i, ev in enumerate(fired) if ev.done and i not in matched
                  and ev.group == e.data.get("group") and (ev.fired_at or 0) <= _at(e)), None)  # fmt: skip
        if i is None:
            stray.append(e)
        else:
            matched[i] = e
    return matched, stray


def survivors(fired: Sequence[Fired], evs: Sequence[Event]) -> Check:
    """Only the group each event hit left before the run's end."""
    name = "no surviving group restarted"
    _, stray = _match(fired, evs)
    if stray:
        e = stray[0]
        return Check(name, False, f"group {e.data.get('group')} left ({e.data.get('cause')}, "
                     f"exit {e.data.get('exit_code')}) though no event hit it: a surviving group "
                     "restarted", "a survivor must not exit when a peer is lost: wait on the "
                     "Manager's allreduce (a failed step is not committed) and do not exit on "
                     "a failed collective")  # fmt: skip
    started = sorted({int(e.data["group"]) for e in _of(evs, GROUP_JOINED)
                      if isinstance(e.data.get("group"), int)})  # fmt: skip
    said = [f"{ev.kind}: group {ev.group} left, {', '.join(str(k) for k in started if k != ev.group)}"
            " trained on" for ev in fired if ev.done]  # fmt: skip
    return Check(name, True, "; ".join(said) or "no event was driven, no group left early")


def _healed_one(ev: Fired, left: Event | None, evs: Sequence[Event], qs: Sequence[Quorum]) -> str:
    """What group `ev.group`'s replacement did, or (starting ``"FAIL "``) why it did not heal."""
    g = ev.group
    if left is None:
        return f"FAIL group {g} never left after the {ev.kind} event"
    join = next((e for e in _of(evs, GROUP_JOINED, g)
                 if e.data.get("replacement") and _at(e) >= _at(left)), None)  # fmt: skip
    if join is None:
        return f"FAIL group {g}'s replacement never joined after it left"
    loaded = [e for e in evs if e.reason == RUN_RESUMED and _at(e) >= _at(join)]
    if loaded:
        return f"FAIL group {g}'s replacement loaded a checkpoint ({loaded[0].message})"
    heal = next((e for e in _of(evs, GROUP_HEALED, g) if _at(e) >= _at(join)), None)
    if heal is not None:
        d = heal.data
        if d.get("source") is None or d.get("source") == g:
            return f"FAIL group {g} healed from group {d.get('source')}, not a live peer"
        if d.get("from_step") not in (0, None):
            return (f"FAIL group {g}'s replacement entered the quorum at step {d.get('from_step')}"
                    f", not 0: it loaded state of its own before healing")  # fmt: skip
        took = d.get("took_s")
        after = f", {took:.1f} s after it started" if isinstance(took, int | float) else ""
        return f"group {g} healed from group {d.get('source')} at step {d.get('step')}{after}"
    first = next((q for q in qs if q.created >= _at(join)
                  and any(group_of(r) == g for r in q.members)), None)  # fmt: skip
    if first is None:
        return f"FAIL group {g}'s replacement never entered a quorum"
    mine = next(s for r, s in first.members.items() if group_of(r) == g)
    if mine > 0:
        return f"FAIL group {g}'s replacement entered at step {mine} with no heal: it loaded a checkpoint"
    return f"group {g}'s replacement entered at step 0 with its peers (nothing to heal yet)"


def healed(fired: Sequence[Fired], evs: Sequence[Event], qs: Sequence[Quorum]) -> Check:
    """Each event's replacement group healed from a live peer, with no checkpoint loaded."""
    name = "replacement healed from a live peer, no checkpoint loaded"
    matched, _ = _match(fired, evs)
    said = [_healed_one(ev, matched.get(i), evs, qs) for i, ev in enumerate(fired) if ev.done]
    bad = [s.removeprefix("FAIL ") for s in said if s.startswith("FAIL ")]
    if bad:
        return Check(name, False, bad[0], "give TorchFT's Manager state_dict= and "
                     "load_state_dict= so a joining group takes a live peer's weights, and "
                     "load no checkpoint in a group that joins a live quorum")  # fmt: skip
    return Check(name, True, "; ".join(said) or "no event was driven")


def stall_bound(evs: Sequence[Event], ref_qs: Sequence[Quorum]) -> tuple[float, float] | None:
    """(the lighthouse's heartbeat timeout, the stall's bound), in seconds, from the run's
    ``LighthouseStarted``; None when it announced none. The bound: the heartbeat and join
    timeouts, `SLACK_S` and `SLACK_STEPS` step times (the uninterrupted run's median)."""
    told = _of(evs, LIGHTHOUSE_STARTED)
    if not told or not isinstance(told[-1].data.get("heartbeat_timeout_ms"), int | float):
        return None
    hb = float(told[-1].data["heartbeat_timeout_ms"]) / 1000
    join = float(told[-1].data.get("join_timeout_ms") or 0) / 1000
    gaps = [b.created - a.created for a, b in itertools.pairwise(ref_qs)]
    step = statistics.median(gaps) if gaps else 0.0
    return hb, hb + join + SLACK_S + SLACK_STEPS * step


def stall(fired: Sequence[Fired], evs: Sequence[Event], ref_qs: Sequence[Quorum]) -> Check:
    """The survivors' wait for a quorum without the group each event hit."""
    name = "survivors' stall"
    told = stall_bound(evs, ref_qs)
    if told is None:
        return Check(name, False, "the run announced no lighthouse (no LighthouseStarted): is it "
                     "replica groups?", "launch it with fault_tolerance='torchft'")  # fmt: skip
    hb, bound = told
    said = []
    for ev in (ev for ev in fired if ev.done):
        if ev.kind == "setup":
            said.append(f"{ev.kind}: none (before the first step)")
            continue
        q = next((e for e in _of(evs, QUORUM_CHANGED) if _at(e) > (ev.fired_at or 0)
                  and ev.group not in (e.data.get("groups") or [])), None)  # fmt: skip
        if q is None:
            return Check(name, False, f"the survivors never formed a quorum without group "
                         f"{ev.group} after the {ev.kind} event", "see the run's log")  # fmt: skip
        waited = float(q.data.get("waited_s") or 0.0)
        if waited > bound:
            return Check(name, False, f"after the {ev.kind} event the survivors waited {waited:.1f}"
                         f" s for a quorum without group {ev.group}, more than the lighthouse's "
                         f"heartbeat timeout ({hb:.1f} s) explains (bound {bound:.1f} s)",
                         "a collective with a dead peer held them: give the process group a "
                         "timeout near the heartbeat's (ProcessGroupGloo(timeout=...))")  # fmt: skip
        said.append(f"{ev.kind}: {waited:.1f} s at step {q.data.get('step')}")
    return Check(name, True, f"{'; '.join(said) or 'no event was driven'} (heartbeat timeout "
                 f"{hb:.1f} s, bound {bound:.1f} s)")  # fmt: skip


def finished(state: str, ref_state: str) -> Check:
    name = "finished as the uninterrupted run"
    if ref_state != "succeeded":
        return Check(name, False, f"the uninterrupted run {ref_state}: nothing to compare with",
                     "see the uninterrupted run's log")  # fmt: skip
    if state != ref_state:
        return Check(name, False, f"the interrupted run {state}, the uninterrupted one "
                     f"{ref_state}", "see the interrupted run's log")  # fmt: skip
    return Check(name, True, "both succeeded")


def check(
    fired: Sequence[Fired],
    evs: Sequence[Event],
    qs: Sequence[Quorum],
    ref_qs: Sequence[Quorum],
    twice: int,
    state: str,
    ref_state: str,
) -> list[Check]:
    """The five checks, in order, of the interrupted run (`evs`, `qs`, its final `state`) against
    the uninterrupted one's quorums and state."""
    return [
        steps_once(qs, ref_qs, twice),
        survivors(fired, evs),
        healed(fired, evs, qs),
        stall(fired, evs, ref_qs),
        finished(state, ref_state),
    ]


def render(cert: Certificate) -> list[str]:
    """The fault-tolerant part of `cert`'s text: its events, its checks and why the parameters
    are not compared."""
    out = ["events (replica groups, fault_tolerance='torchft'):"]
    for ev in cert.events:
        if not ev.done:
            out.append(f"  NOT DONE  {ev.label}: {ev.note}")
            continue
        where = f"at step {ev.at_step}" if ev.at_step is not None else "before any step"
        out.append(f"  done      {ev.label} ({where}{'; ' + ev.note if ev.note else ''})")
    out += [f"  NOT DONE  {label}: {why}" for label, why in cert.not_done]
    out.append("checks (fault-tolerant):")
    out += [f"  {'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in cert.checks or []]
    out.append(f"final parameters: not compared ({NOT_COMPARED})")
    return out
