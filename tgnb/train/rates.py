"""At a restart on Slurm or Kubernetes, the preemption rate ``checkpoint.auto`` weighs, updated
with what this run saw since the estimate.

The launch estimates the run's rate from the cluster's ``node_lifecycle_events``
(`tgnb.cloud.rates`) and leaves in the run's config its weight, in hours of the run
(``preemptions_weight_hours``: prior and observed node-hours over the run's nodes) and its time
(``preemptions_as_of``). The local engine reads the cluster again before each restart. The nodes of
Slurm and Kubernetes cannot: they hold no API key, by design. What they hold is the run's own
``events.jsonl`` in its run directory, which every attempt appends to. So at a restart
(``TGNB_RESTART_COUNT`` or ``SLURM_RESTART_COUNT`` above 0) the runtime folds into the launch's
estimate the run's own record since that time, as the same Gamma-Poisson update, in hours of the run:

    λ' = (λ·W + k) / (W + t),

where λ is the estimate (per hour of the run), W its weight, k the attempts since then that were
told of a preemption (a ``SignalReceived`` or ``DrainNoticeReceived``) and t the hours those
attempts ran (each from its ``RunStarted`` to its last event). It sees less than a cluster read
would: the preemptions of the run's own nodes only, and a node lost without a notice not at all
(that is a failure to it). Nothing is written back: each restart folds the whole record since the
launch again (the policy returned says so: its weight and time are the update's). On the local engine the supervisor's re-read is newer than every attempt, so this adds nothing;
when that read failed, the fold stands in for it. A config with no estimate's time (``auto`` off, or no estimate at launch: not on
preemptible nodes) is left as it is.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from tgnb.events import (
    DRAIN_NOTICE,
    RUN_STARTED,
    SIGNAL_RECEIVED,
    Event,
    format_time,
    parse_time,
    read_jsonl,
    utcnow,
)
from tgnb.runs.policy import CheckpointPolicy


@dataclasses.dataclass(frozen=True)
class OwnRecord:
    """What the run's own events show after a time: `preemptions` over `hours` of `attempts`."""

    preemptions: int
    hours: float
    attempts: int


def own_record(events: Iterable[Event], after: datetime, pid: int | None = None) -> OwnRecord:
    """The run's attempts that started after `after` (from its runtime's events: source
    ``run``), the preemptions they were told of, and the hours they ran; not the attempt of
    process `pid` (this one, if it recorded its start already)."""
    spans: list[list[Event]] = []
    for ev in sorted((e for e in events if e.source == "run"), key=lambda e: e.time):
        if ev.reason == RUN_STARTED:
            spans.append([ev])
        elif spans:
            spans[-1].append(ev)
    spans = [s for s in spans if s[0].time > after and (pid is None or s[0].data.get("pid") != pid)]
    told = sum(1 for s in spans if any(e.reason in (SIGNAL_RECEIVED, DRAIN_NOTICE) for e in s))
    seconds = sum((s[-1].time - s[0].time).total_seconds() for s in spans)
    return OwnRecord(told, seconds / 3600.0, len(spans))


def at_restart(
    policy: CheckpointPolicy, run_dir: str | os.PathLike[str], restart: int
) -> CheckpointPolicy:
    """`policy` with its rate updated by the run's own record since the estimate (see the module
    docstring), at `restart` (above 0); `policy` itself when there is nothing to update."""
    est = policy.estimate
    if not (policy.auto_interval and restart > 0 and est and est.as_of and est.weight_hours):
        return policy
    try:
        since = parse_time(est.as_of)
    except ValueError:
        return policy
    seen = own_record(read_jsonl(Path(run_dir) / "events.jsonl"), since, os.getpid())
    if not seen.attempts:  # the estimate is newer than every attempt (the local engine's)
        return policy
    # as of now: folding it again adds nothing
    new = est.updated(seen.preemptions, seen.hours, "", format_time(utcnow()))
    line = (
        f"checkpoint.auto weighs {new.per_hour:.3g} preemptions per hour of the run: the "
        f"estimate {est.per_hour:.3g} (as {est.weight_hours:.3g} h of the run) updated at restart "
        f"{restart} with this run's own {seen.preemptions} preemption(s) over {seen.hours:.3g} h "
        f"in {seen.attempts} attempt(s) since {format_time(since)} (the nodes read no cluster); "
        f"at launch: {est.source}"
    )
    return policy.with_estimate(dataclasses.replace(new, source=line))
