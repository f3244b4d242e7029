"""The certificate: what each event cost, steps logged twice, the final state against the
uninterrupted run's, and what is missing, each named with its fix. `Certificate.safe` is the
verdict `tgnb certify` exits on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tgnb.certify.chaos import Fired
from tgnb.certify.state import StateMatch
from tgnb.events import RUN_EXITED, RUN_REQUEUED, RUN_RESUMED, RUN_STARTED, Event
from tgnb.runs.outcome import UNSAVED

#: Events that give notice: at most one step may be lost to each.
NOTICE = ("setup", "first-save", "random-step", "shrink")


@dataclass(frozen=True)
class Finding:
    """Something missing in the program, and the fix."""

    defect: str
    fix: str


@dataclass
class Certificate:
    target: str
    events: list[Fired]
    lost: list[tuple[int, int] | None]  # per event: (last step logged, steps lost); None: unknown
    twice: int
    state: StateMatch
    findings: list[Finding] = field(default_factory=list)
    not_done: list[tuple[str, str]] = field(default_factory=list)
    wall_s: float = 0.0
    seed: int = 0

    @property
    def complete(self) -> bool:
        return all(ev.done for ev in self.events)

    @property
    def safe(self) -> bool:
        return not self.findings and self.state.ok and self.complete

    @property
    def exit_code(self) -> int:
        return 0 if self.safe else 1

    def __str__(self) -> str:
        verdict = "SAFE" if self.safe else ("NOT SAFE" if self.findings else "NOT CERTIFIED")
        head = f"tgnb certify {self.target}: {verdict} ({self.wall_s:.0f} s, seed {self.seed})"
        out = [head, "", "events:"]
        for ev, lost in zip(self.events, self.lost, strict=True):
            if not ev.done:
                out.append(f"  NOT DONE  {ev.label}: {ev.note}")
                continue
            where = f"at step {ev.at_step}" if ev.at_step is not None else "before any step"
            note = f"; {ev.note}" if ev.note else ""
            if lost is None:
                cost = "steps lost not counted (no resume recorded)"
            else:
                cost = f"stopped after step {lost[0]}, {lost[1]} step(s) lost"
            out.append(f"  done      {ev.label} ({where}{note}): {cost}")
        for label, why in self.not_done:
            out.append(f"  NOT DONE  {label}: {why}")
        out += [f"steps logged twice: {self.twice}",
                f"final state: {self.state.verdict} ({self.state.detail})"]  # fmt: skip
        if self.findings:
            out += ["", "missing:"]
            out += [f"  - {f.defect}\n    fix: {f.fix}" for f in self.findings]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        from tgnb.markup import escape

        return f"<pre>{escape(str(self))}</pre>"


def _run_events(evs: list[Event], reason: str) -> list[Event]:
    return [e for e in evs if e.reason == reason and e.source == "run"]


def steps_lost(ev: Fired, rows: list[dict[str, Any]], evs: list[Event]) -> tuple[int, int] | None:
    """The last step the attempt hit by `ev` logged, and how many of its steps the next attempt
    did not resume (None: no next attempt recorded a start)."""
    if ev.fired_at is None:
        return None
    starts = [e for e in _run_events(evs, RUN_STARTED) if e.time.timestamp() > ev.fired_at]
    if not starts:
        return None
    at = starts[0].time.timestamp()
    until = starts[1].time.timestamp() if len(starts) > 1 else float("inf")
    before = max((int(r["step"]) for r in rows if float(r.get("time", 0)) < at), default=0)
    resumed = next((int(e.data["step"]) for e in _run_events(evs, RUN_RESUMED)
                    if at <= e.time.timestamp() < until and "step" in e.data), 0)  # fmt: skip
    return before, max(0, before - resumed)


def logged_twice(rows: list[dict[str, Any]]) -> int:
    counts = Counter(int(r["step"]) for r in rows if "step" in r)
    return sum(1 for n in counts.values() if n > 1)


def exited_zero_after_notice(events: list[Fired], evs: list[Event], finished_early: bool) -> bool:
    """Whether an attempt given notice ended without a checkpoint of its own: requeued with exit
    0, or as unsaved (`tgnb.runs.outcome`: the launcher's record of a program that stopped on
    the signal and sealed nothing), or the run ended short."""
    notices = [ev.fired_at for ev in events if ev.kind in NOTICE and ev.fired_at is not None]
    if not notices:
        return False
    zero = [
        e
        for e in evs
        if (e.reason == RUN_REQUEUED and e.data.get("exit_code") == 0)
        or (
            (e.reason in (RUN_REQUEUED, RUN_EXITED) and e.data.get("steps_lost"))  # unsaved
            and (e.data.get("unsaved") or e.data.get("exit_reason") == UNSAVED)
        )
    ]
    return finished_early or any(e.time.timestamp() > min(notices) for e in zero)
