"""The recovery policy: what an engine does when a run's attempt ends, read top to bottom.

Modelled on SkyPilot's recovery strategy: one dataclass in the run's spec (`RunSpec.recovery`), one
pure function (`decide`) that every engine calls or renders. Nothing here talks to a cluster.

When an attempt ends
    exit 0 is done. An exit code in `RecoveryPolicy.resume_codes` (`Exit.PREEMPTED`, 75: the run
    checkpointed on a preemption notice) or the loss of a node is a *preemption*: the run starts
    again from its newest checkpoint, and preemptions never count against the budget. Any other
    code is a *failure*: counted, and restarted after `backoff(failures)` seconds while the count
    is at most `max_restarts`. `Exit.BAD_CONFIG` (refused before training), `Exit.NO_SPACE`
    (the disk is full) and `Exit.REPEATS` (a failure a restart would repeat: a module not
    installed, CUDA absent; the node's tgnb process exits with it, `tgnb.runs.outcome.repeats`)
    are final: a restart cannot fix them (`is_final`).

When capacity to restart is short (`when_short`)
    ``"wait"`` (the default, and what every engine did before this policy): wait until `nodes`
    preemptible nodes are free. ``"shrink"``: after `wait_s` short, start on as many as are free,
    down to `Resources.min_nodes`, at the smaller world size (the runtime keeps the global batch by scaling
    gradient accumulation), and grow back at a later restart. ``"standard"``: after `wait_s`
    without the preemptible nodes, start on the cluster's standard nodes; every placement prefers
    preemptible first, so the next restart goes back to them.

An optional `deadline` (POSIX seconds): finish by it at the least cost. The rule is "uniform
progress" from "Can't Be Late" (Wu et al., NSDI '24): the run should have done at least the share
of its steps that the share of the time to the deadline has passed. While it is on track it uses
preemptible nodes (and `when_short` applies); when it is behind, or its slack (the time left minus
the work left minus one restart) has run out, it takes standard nodes. Back on track, it returns to
preemptible nodes at its next placement.

Back to preemptible
    A run on standard nodes that asked for preemptible ones (moved there by ``"standard"`` or a
    deadline) goes back as soon as the policy would start it there: `decide` on the facts of a
    running attempt (`Facts.current`) says ``start`` on preemptible nodes ("back to preemptible:
    ..."), and the engine stops the attempt (it checkpoints) so that it restarts there; otherwise
    ``keep`` (it stays where it runs, nothing recorded).

Each `Decision` carries a human `reason` ("shrunk to 1 node: 8 of 16 preemptible GPUs allocated
for 10 min") that the engine puts on the run's timeline (`tgnb.events.RECOVERY_DECIDED`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tgnb.errors import ValidationError
from tgnb.runs import node
from tgnb.runs.durations import check_deadline, check_seconds
from tgnb.runs.node import Exit

WhenShort = Literal["wait", "shrink", "standard"]
WHEN_SHORT: tuple[str, ...] = ("wait", "shrink", "standard")
NodeClass = Literal["preemptible", "standard"]
#: Exit codes a restart cannot fix: the run fails at once, whatever the budget; and the node's
#: stop at the run's ``budget_usd`` (`Exit.STOPPED`): never restarted, it ends cancelled.
FINAL_CODES = frozenset(
    {int(Exit.BAD_CONFIG), int(Exit.NO_SPACE), int(Exit.STOPPED), int(Exit.REPEATS)}
)
MAX_RESTARTS_LIMIT = 10_000


@dataclass(frozen=True)
class RecoveryPolicy:
    """How a run recovers. Validated with the spec (`validate`), before anything is submitted."""

    #: Failures restarted before the run fails (preemptions never count).
    max_restarts: int = 3
    #: Seconds before the restart after the first failure; doubled each failure, capped.
    backoff_s: float = 5.0
    backoff_max_s: float = 300.0
    #: Exit codes that mean "preempted, checkpointed: resume me".
    resume_codes: tuple[int, ...] = (int(Exit.PREEMPTED),)
    when_short: str = "wait"
    #: seconds short of preemptible capacity before shrinking or moving to standard nodes
    wait_s: float = 600.0
    #: Finish by this time (POSIX seconds) at the least cost (uniform progress).
    deadline: float | None = None

    # -- the budget --------------------------------------------------------------------------

    def is_resume(self, code: int | None) -> bool:
        return code is not None and code in self.resume_codes

    def is_final(self, code: int | None) -> bool:
        return code is not None and code in FINAL_CODES and code not in self.resume_codes

    def restart_after_failure(self, failures: int, code: int | None) -> bool:
        """Whether the `failures`-th failure (counted, this one included) is restarted."""
        return not self.is_final(code) and failures <= self.max_restarts

    def backoff(self, failures: int) -> float:
        """Seconds to wait before restarting after the `failures`-th failure (1, 2, ...)."""
        if failures <= 0:
            return 0.0
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** min(failures - 1, 30)))

    # -- validation and storage --------------------------------------------------------------

    def validate(
        self,
        nodes: int = 1,
        min_nodes: int | None = None,
        preemptible: bool = True,
        now: float | None = None,
    ) -> None:
        """One-line errors that name the fix; `nodes`, `min_nodes`, `preemptible`: the run's
        `Resources`; `now` (default: the clock) what a deadline must be after. Every duration
        has a range (`tgnb.runs.durations`)."""
        m = self.max_restarts
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= MAX_RESTARTS_LIMIT:
            raise ValidationError(
                f"max_restarts must be an integer from 0 to {MAX_RESTARTS_LIMIT}, got {m!r:.40}: "
                "e.g. RecoveryPolicy(max_restarts=3)"
            )
        for name in ("backoff_s", "backoff_max_s", "wait_s"):
            check_seconds(name, getattr(self, name))
        if self.backoff_max_s < self.backoff_s:
            raise ValidationError(
                f"backoff_max_s ({self.backoff_max_s}) is below backoff_s ({self.backoff_s}): "
                f"raise backoff_max_s to at least {self.backoff_s}"
            )
        codes = self.resume_codes
        if not isinstance(codes, tuple) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in codes
        ):
            raise ValidationError(
                f"resume_codes must be a tuple of exit codes from 1 to 255, got {codes!r:.60}: "
                f"e.g. resume_codes=({int(Exit.PREEMPTED)},)"
            )
        if self.when_short not in WHEN_SHORT:
            raise ValidationError(
                f"when_short must be one of {', '.join(WHEN_SHORT)}, got {self.when_short!r:.40}: "
                "e.g. when_short='shrink'"
            )
        if (self.when_short == "standard" or self.deadline is not None) and not preemptible:
            what = "deadline" if self.deadline is not None else "when_short='standard'"
            raise ValidationError(
                f"{what} chooses when to leave preemptible nodes, and this run is on standard "
                "nodes: launch with preemptible=True"
            )
        if self.when_short == "shrink" and (min_nodes is None or min_nodes >= nodes):
            raise ValidationError(
                f"when_short='shrink' restarts on fewer nodes, down to min_nodes: pass a min_nodes "
                f"below nodes ({nodes}), e.g. nodes={max(nodes, 2)}, min_nodes=1"
            )
        if self.deadline is not None:
            check_deadline(self.deadline, time.time() if now is None else now)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["resume_codes"] = list(self.resume_codes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecoveryPolicy:
        d = dict(data)
        if "resume_codes" in d and isinstance(d["resume_codes"], list):
            d["resume_codes"] = tuple(d["resume_codes"])
        return cls(**d)

    @classmethod
    def coerce(
        cls, value: RecoveryPolicy | Mapping[str, Any] | str | None
    ) -> RecoveryPolicy | None:
        """A policy from what a caller passes: a policy, a mapping of its fields, or a
        `when_short` name (``"shrink"``)."""
        if value is None or isinstance(value, RecoveryPolicy):
            return value
        if isinstance(value, str):
            return cls(when_short=value)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValidationError(
                    f"recovery has no field {unknown[0]!r:.40}: use "
                    f"{', '.join(cls.__dataclass_fields__)}"
                )
            return cls.from_dict(value)
        raise ValidationError(
            f"recovery must be a RecoveryPolicy, a mapping or one of {', '.join(WHEN_SHORT)}, "
            f"got {type(value).__name__}"
        )


def policy_for(
    recovery: RecoveryPolicy | None, min_nodes: int | None, nodes: int
) -> RecoveryPolicy:
    """The policy a run follows: its own, or the default. A run that gave `min_nodes` below
    `nodes` and no policy shrinks (what `--nodes=MIN-MAX` did before the policy existed)."""
    if recovery is not None:
        return recovery
    if min_nodes is not None and min_nodes < nodes:
        return RecoveryPolicy(when_short="shrink", wait_s=0.0)
    return RecoveryPolicy()


# -- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What the engine sees when it places a run (again)."""

    nodes: int  # the run's `Resources.nodes`
    min_nodes: int | None = None
    preemptible: bool = True  # the run asks for preemptible nodes
    #: nodes of each class schedulable now with the GPUs the run needs on each
    free: Mapping[str, int] = field(default_factory=dict)
    short_for_s: float = 0.0  # how long this placement has waited for preemptible capacity
    allocated_gpus: int | None = None  # the cluster's preemptible GPUs live, and its target
    desired_gpus: int | None = None
    gpus_per_node: int = 8
    # progress, for a deadline
    now: float = 0.0
    started: float | None = None  # when the run first started (POSIX seconds)
    steps_done: int = 0
    steps_total: int | None = None
    step_s: float | None = None  # seconds per step at full size, as observed
    restart_s: float = 60.0  # what one restart costs (start, resume)
    #: the class the run's attempt runs on now; None while it waits for a placement
    current: NodeClass | None = None


def progress(
    run_dir: str | os.PathLike[str], started: float, max_steps: Any, now: float
) -> dict[str, Any]:
    """The progress fields of `Facts`, from the run's own metrics (`tgnb.runs.node.last_step`):
    the step time is observed since the run first started, waits included (a conservative
    estimate for a deadline). `max_steps`: the run's training config's, if any."""
    steps = node.last_step(run_dir)
    total = max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) else 0
    return {
        "now": now,
        "started": started,
        "steps_done": steps,
        "steps_total": total if total > 0 else None,
        "step_s": (now - started) / steps if steps else None,
    }


@dataclass(frozen=True)
class Decision:
    action: Literal["start", "wait", "keep"]
    nodes: int
    node_class: NodeClass
    reason: str
    rule: str  # "full", "wait", "shrink", "standard", "deadline", "keep"

    def data(self) -> dict[str, Any]:
        """The fields a ``RecoveryDecided`` event carries (its message is `reason`), the same on
        every engine."""
        return {k: getattr(self, k) for k in DECISION_DATA}


#: The fields of a `Decision` in a ``RecoveryDecided`` event's data.
DECISION_DATA = ("action", "nodes", "node_class", "rule")


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def _capacity(f: Facts) -> str:
    if f.allocated_gpus is None or f.desired_gpus is None:
        return f"{f.free.get('preemptible', 0)} preemptible node(s) free"
    return f"{f.allocated_gpus} of {f.desired_gpus} preemptible GPUs allocated"


def _nodes(n: int, kind: str = "") -> str:
    return f"{n} {kind + ' ' if kind else ''}node" + ("" if n == 1 else "s")


def behind_schedule(policy: RecoveryPolicy, f: Facts) -> str | None:
    """Why a run with a deadline must take standard nodes now, or None while it is on track."""
    if policy.deadline is None or f.started is None or not f.steps_total or not f.step_s:
        return None  # no deadline, or no progress measured yet to judge by
    left_s = policy.deadline - f.now
    work_s = max(0, f.steps_total - f.steps_done) * f.step_s
    if left_s - work_s - f.restart_s <= 0:
        return f"slack ran out: {_minutes(max(left_s, 0))} to the deadline, {_minutes(work_s)} of work left"
    span = policy.deadline - f.started
    due = (
        f.steps_total * min(1.0, max(0.0, (f.now - f.started) / span))
        if span > 0
        else f.steps_total
    )
    if f.steps_done < math.floor(due):
        return f"behind uniform progress: step {f.steps_done} of {f.steps_total}, {math.floor(due)} due by now"
    return None


def decide(policy: RecoveryPolicy, f: Facts) -> Decision:
    """Where the run starts next, or that it waits, and why; for a run that runs
    (`Facts.current`), whether it goes back to preemptible nodes. Pure: the same facts, the same
    decision, so every engine renders one rule."""
    if f.current is not None:
        return _running(policy, f)
    want = f.nodes
    least = (f.min_nodes or want) if policy.when_short == "shrink" else want
    pre, std = f.free.get("preemptible", 0), f.free.get("standard", 0)
    if not f.preemptible:
        n = min(std, want)
        if n >= least:
            why, rule = (f"on {_nodes(n, 'standard')}", "full" if n == want else "shrink")
            return Decision("start", n, "standard", why, rule)
        return Decision(
            "wait", want, "standard", f"waiting for {_nodes(least, 'standard')}", "wait"
        )
    late = behind_schedule(policy, f)
    enough_standard = std >= (f.min_nodes or want)  # a run that declared min_nodes may run smaller
    if late and enough_standard:
        n = min(std, want)
        return Decision("start", n, "standard", f"moved to standard: {late}", "deadline")
    # behind with no standard capacity either: take what preemptible capacity there is
    if pre >= want:
        return Decision("start", want, "preemptible", f"on {_nodes(want, 'preemptible')}", "full")
    short = f"{_capacity(f)} for {_minutes(f.short_for_s)}"
    waited = f.short_for_s >= policy.wait_s
    if policy.when_short == "shrink" and waited and pre >= least:
        return Decision("start", pre, "preemptible", f"shrunk to {_nodes(pre)}: {short}", "shrink")
    if policy.when_short == "standard" and waited and enough_standard:
        n = min(std, want)
        why = f"moved to {_nodes(n, 'standard')}: {short}"
        return Decision("start", n, "standard", why, "standard")
    rule = "deadline" if late else "wait"
    return Decision(
        "wait", want, "preemptible", f"waiting for {_nodes(least, 'preemptible')}: {short}", rule
    )


def _running(policy: RecoveryPolicy, f: Facts) -> Decision:
    """A run on standard nodes that asked for preemptible ones goes back to them as soon as its
    placement would start there now; any other run keeps its nodes."""
    assert f.current is not None
    keep = Decision("keep", f.nodes, f.current, f"on {_nodes(f.nodes, f.current)}", "keep")
    if f.current != "standard" or not f.preemptible:
        return keep
    d = decide(policy, dataclasses.replace(f, current=None, short_for_s=0.0))
    if d.action != "start" or d.node_class != "preemptible":
        return keep
    return dataclasses.replace(d, reason=f"back to preemptible: {d.reason}")
