"""What a fault-tolerant run's replica groups did (issue 50), as its summary says it: which left,
when and why, which joined as a replacement, and from whom and at which step each healed, in how
long. Read from the engine's events alone (``GroupJoined``, ``GroupLeft``, ``GroupHealed``,
``QuorumChanged``, `tgnb.events`), so it holds for any program on TorchFT's Manager; the step is
the quorum's (the lighthouse's record), one count for the run, never a sum over its groups. A
pure function of a plain list of events: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tgnb.events import GROUP_HEALED, GROUP_JOINED, GROUP_LEFT, QUORUM_CHANGED, Event

#: The note of replica groups with no checkpoint of tgnb's (`tgnb.runs.outcome.UNPROTECTED`'s
#: counterpart): a group heals from the others; only losing them all at once starts again.
UNPROTECTED_GROUPS = (
    "unprotected if every group goes at once: a preempted group heals from the others"
)
#: How a group's leaving reads, by the engine's cause (`tgnb.backends.local.groups`).
_LEFT = {
    "notice": "preempted (notice)",
    "removed": "its node was removed",
    "lost": "lost",
    "finished": "finished",
    "stopped": "stopped",
    "budget": "stopped at the budget",
    "moved": "moved back to a preemptible node",
}


def group_lines(events: Iterable[Event]) -> list[str]:
    """One line for the run's groups (how many started, left, joined as replacements, healed),
    then one per group that left before the run's end and one per replacement, in order; empty
    for a run that is not replica groups."""
    mine = (GROUP_JOINED, GROUP_LEFT, GROUP_HEALED, QUORUM_CHANGED)
    evs = sorted((e for e in events if e.reason in mine), key=lambda e: e.time)  # (cheap per poll)
    joined = [e for e in evs if e.reason == GROUP_JOINED]
    if not joined:
        return []
    quorums = [e for e in evs if e.reason == QUORUM_CHANGED]
    first = [e for e in joined if not e.data.get("replacement")]
    left = [e for e in evs if e.reason == GROUP_LEFT]
    early = [e for e in left if e.data.get("cause") != "finished"]
    healed = [e for e in evs if e.reason == GROUP_HEALED]
    where = ", ".join(f"{e.data.get('group')} on {e.node}" for e in first)
    out = [
        f"groups: {len(first)} at the start ({where}); {len(early)} left before the end, "
        f"{len(joined) - len(first)} replacement(s) joined, {len(healed)} healed"
    ]
    for e in evs:
        group = e.data.get("group")
        if e.reason == GROUP_LEFT and e.data.get("cause") != "finished":
            out.append(_left(e, group, quorums))
        elif e.reason == GROUP_JOINED and e.data.get("replacement"):
            heal = next(
                (h for h in healed if h.data.get("group") == group and h.time >= e.time), None
            )
            out.append(f"group {group} joined again (replacement) on {e.node}; " + _healed(heal))
    return out


def _left(e: Event, group: Any, quorums: list[Event]) -> str:
    """Group `group` left at event `e`: why, at the quorum's step, and how long the others waited
    for a quorum without it (the first one after it that leaves it out)."""
    cause = str(e.data.get("cause") or "")
    why = _LEFT.get(cause, cause or "left")
    code = e.data.get("exit_code")
    if cause == "lost" and code is not None:
        why += f" (exit {code})"
    after = next(
        (q for q in quorums if q.time >= e.time and group not in (q.data.get("groups") or [])),
        None,
    )
    before = [q for q in quorums if q.time <= e.time]
    if after is not None:
        waited = after.data.get("waited_s")
        groups = after.data.get("groups") or []
        wait = f" after {waited:.1f} s" if isinstance(waited, int | float) else ""
        return (
            f"group {group} left at step {after.data.get('step')}: {why}; "
            f"groups {groups} went on{wait}"
        )
    at = f" at step {before[-1].data.get('step')}" if before else ""
    return f"group {group} left{at}: {why}"


def _healed(heal: Event | None) -> str:
    if heal is None:
        return "not healed (it never entered a quorum)"
    d = heal.data
    took = d.get("took_s")
    how_long = f", {took:.1f} s after it started" if isinstance(took, int | float) else ""
    return f"healed from group {d.get('source')} at step {d.get('step')}{how_long}"


def group_clause(lines: list[str]) -> str:
    """The groups' line for a run's closing line (`tgnb.runs.summary.closing_line`): ``""`` for
    a run that is not replica groups."""
    return f"; {lines[0]}" if lines else ""


__all__ = ["UNPROTECTED_GROUPS", "group_clause", "group_lines"]
