"""The certificate: what each event cost, steps logged twice, the final state against the
uninterrupted run's, what a real launch risks, and what is missing, each named with its fix.
`Certificate.safe` is the verdict `tgnb certify` exits on.

What a real launch risks is the checkpoint interval the program announced
(``CheckpointIntervalChosen``): a node lost with no notice loses at most its steps. The
certificate gives the uninterrupted run's last one (the interval a launch settles on), and beside
each event the one the interrupted run announced before it; a kill that lost more than that
(plus the step in progress) is not certified."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tgnb.certify import groups
from tgnb.certify.chaos import Fired
from tgnb.certify.state import StateMatch
from tgnb.events import (
    CHECKPOINT_INTERVAL,
    RUN_EXITED,
    RUN_REQUEUED,
    Event,
)
from tgnb.runs.outcome import UNSAVED
from tgnb.runs.summary import attempts

#: Events that give notice: at most one step may be lost to each.
NOTICE = ("setup", "first-save", "random-step", "shrink")


@dataclass(frozen=True)
class Finding:
    """Something missing in the program, and the fix."""

    defect: str
    fix: str


@dataclass(frozen=True)
class Told:
    """A checkpoint interval the program announced: `steps` of training, `seconds` at the step
    time then, under `rule` (``auto``, ``every_steps``, ``every_seconds``), at `step`."""

    steps: int
    seconds: float
    rule: str
    step: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.steps} steps ({_seconds(self.seconds)})"


def _seconds(s: float) -> str:
    return f"{s:.2g} s" if s < 10 else (f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min")


def announced(evs: list[Event], before: float | None = None) -> Told | None:
    """The last interval the program's runtime announced (before `before`, POSIX seconds)."""
    told = [e for e in _run_events(evs, CHECKPOINT_INTERVAL)
            if before is None or e.time.timestamp() <= before]  # fmt: skip
    if not told or "every_steps" not in told[-1].data:
        return None
    d = told[-1].data
    return Told(int(d["every_steps"]), float(d.get("every_s") or 0.0), str(d.get("rule") or "auto"),
                d.get("step"), told[-1].message)  # fmt: skip


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
    #: per event: the interval the interrupted run announced before it (None: none)
    told: list[Told | None] = field(default_factory=list)
    #: the uninterrupted run's last interval: what a real launch risks to a kill
    risk: Told | None = None
    #: certify's own interval (``--save-every``), None: the program's policy, as launched
    save_every: int | None = None
    #: the names of the uninterrupted run and of the interrupted one (their timelines)
    runs: tuple[str, str] | None = None
    #: a fault-tolerant program's checks (`tgnb.certify.groups`), made instead of comparing the
    #: final parameters; None: a run that restarts from checkpoints
    checks: list[groups.Check] | None = None

    @property
    def complete(self) -> bool:
        return all(ev.done for ev in self.events)

    @property
    def exceeded(self) -> list[int]:
        """The events with no notice that lost more than the interval announced before them
        (plus the step in progress): their indices."""
        told = self.told or [None] * len(self.events)
        return [i for i, (ev, lost, t) in enumerate(zip(self.events, self.lost, told, strict=True))
                if ev.kind not in NOTICE and lost is not None and t is not None
                and lost[1] > t.steps + 1]  # fmt: skip

    @property
    def safe(self) -> bool:
        if self.checks is not None:
            return not self.findings and self.complete and all(c.ok for c in self.checks)
        return not self.findings and self.state.ok and self.complete and not self.exceeded

    def risk_line(self) -> str:
        """What a real launch risks to a node lost with no notice, in one line."""
        if self.risk is None:
            return "a real launch risks: unknown (the program announced no checkpoint interval)"
        how = (f"with --save-every {self.save_every}, certify's setting, not the program's own "
               "policy" if self.save_every else f"the program's policy, {self.risk.rule}, as a "
               "launch runs it")  # fmt: skip
        at = f" at step {self.risk.step}" if self.risk.step is not None else ""
        return (f"a real launch risks: up to {self.risk} lost to a kill with no notice ({how})\n"
                f"  announced{at} by the uninterrupted run: {self.risk.message}")  # fmt: skip

    @property
    def exit_code(self) -> int:
        return 0 if self.safe else 1

    def __str__(self) -> str:
        verdict = "SAFE" if self.safe else ("NOT SAFE" if self.findings else "NOT CERTIFIED")
        head = f"tgnb certify {self.target}: {verdict} ({self.wall_s:.0f} s, seed {self.seed})"
        if self.checks is not None:
            return "\n".join([head, "", *groups.render(self), *self._tail()])
        out = [head, "", "events:"]
        told = self.told or [None] * len(self.events)
        for i, (ev, lost, t) in enumerate(zip(self.events, self.lost, told, strict=True)):
            if not ev.done:
                out.append(f"  NOT DONE  {ev.label}: {ev.note}")
                continue
            where = f"at step {ev.at_step}" if ev.at_step is not None else "before any step"
            note = f"; {ev.note}" if ev.note else ""
            if lost is None:
                cost = "steps lost not counted (no resume recorded)"
            else:
                cost = f"stopped after step {lost[0]}, {lost[1]} step(s) lost"
            if ev.kind not in NOTICE and t is not None:
                more = "MORE than " if i in self.exceeded else "within "
                cost += f", {more}the interval announced before it: {t}"
            out.append(f"  done      {ev.label} ({where}{note}): {cost}")
        for label, why in self.not_done:
            out.append(f"  NOT DONE  {label}: {why}")
        out += [self.risk_line(), f"steps logged twice: {self.twice}",
                f"final state: {self.state.verdict} ({self.state.detail})"]  # fmt: skip
        return "\n".join(out + self._tail())

    def _tail(self) -> list[str]:
        out = []
        if self.runs:
            out.append(f"runs: {self.runs[0]} (uninterrupted), {self.runs[1]} (interrupted)")
        if self.findings:
            out += ["", "missing:"]
            out += [f"  - {f.defect}\n    fix: {f.fix}" for f in self.findings]
        return out

    def _repr_html_(self) -> str:
        from tgnb.markup import escape

        return f"<pre>{escape(str(self))}</pre>"


def _run_events(evs: list[Event], reason: str) -> list[Event]:
    return [e for e in evs if e.reason == reason and e.source == "run"]


def steps_lost(ev: Fired, rows: list[dict[str, Any]], evs: list[Event]) -> tuple[int, int] | None:
    """The last step the attempt hit by `ev` logged, and how many of its steps the next attempt
    did not resume (None: no next attempt recorded a start): the first start after `ev` of
    `tgnb.runs.summary.attempts`, which `Run.summary` counts too."""
    if ev.fired_at is None:
        return None
    after = next((a for a in attempts(rows, evs) if a.at > ev.fired_at), None)
    return None if after is None else (after.before, after.lost)


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
