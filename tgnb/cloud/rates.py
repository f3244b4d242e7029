"""How often the cluster's preemptible nodes are preempted: an estimate from what was observed.

The clusters API keeps ``node_lifecycle_events`` for 72 hours. Over that window (or since the
cluster's first phase, when it is younger) each preemptible node is *exposed* from when it joined
(``TogetherNodeAdded``; for a node live now whose event has aged out, its ``RUNNING`` phase or the
window's start) to its first preemption notice or removal (``TogetherPreemptionNotified``,
``TogetherPreempted``, ``TogetherScaledDown``), or to now while it runs. A preemption is a node
with a notice (or a ``TogetherPreempted`` with none). Hours are wall-clock hours between the
events' timestamps: the clock the run's steps are measured on.

The estimate combines the count k over the exposure T (node-hours) with a prior rate λ0 (the run's
setting) as a Gamma-Poisson posterior mean: a Gamma(λ0·w, w) prior, with w = `PRIOR_NODE_HOURS`
pseudo node-hours of exposure, updated by k preemptions in T node-hours, has the mean

    λ = (λ0·w + k) / (w + T),

so the prior decides while nothing was observed, and a few node-hours of the cluster's own history
outweigh it. (Poisson arrivals: the platform's reclaims of preemptible capacity are treated as
memoryless; a burst of withdrawals counts as several preemptions, as it costs several restarts.)

`apply` writes the run's estimate into its training config: at launch (`tgnb.prelaunch`), and
at each restart of a local run (``apply(..., restart=N)``: the supervisor reads the cluster again, whose
events now hold the preemption that stopped the run, and rewrites the node's config file before
the relaunch). The nodes of Slurm and Kubernetes hold no API key and read no cluster: there the
runtime updates the launch estimate with the run's own record (`tgnb.train.rates`), for which
`apply` leaves the estimate's weight (``preemptions_weight_hours``) and time
(``preemptions_as_of``) in the config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from tgnb.cloud.models import PREEMPTIBLE_PREFIX, ClusterState
from tgnb.events import NODE_ADDED, PREEMPTED, PREEMPTION_NOTIFIED, SCALED_DOWN, format_time, utcnow
from tgnb.runs.policy import (
    PRIOR_NODE_HOURS,
    PreemptionEstimate,
    posterior,
)
from tgnb.runs.trainconfig import TrainConfig

#: How long the platform keeps ``node_lifecycle_events``.
RETENTION = timedelta(hours=72)
_ENDS = (PREEMPTION_NOTIFIED, PREEMPTED, SCALED_DOWN)


@dataclass(frozen=True)
class PreemptionRate:
    """Preemptions per preemptible node-hour: the posterior mean `per_node_hour` and what it
    rests on (`preemptions` over `node_hours` in the last `window_hours`, the `prior`)."""

    per_node_hour: float
    preemptions: int
    node_hours: float
    prior: float
    prior_node_hours: float = PRIOR_NODE_HOURS
    window_hours: float = RETENTION.total_seconds() / 3600.0

    @property
    def observed(self) -> float | None:
        """k / T, the rate seen alone (None: no exposure in the window)."""
        return self.preemptions / self.node_hours if self.node_hours > 0 else None

    def __str__(self) -> str:
        seen = self.observed
        what = "none observed" if seen is None else f"{seen:.3g} observed"
        return (
            f"{self.per_node_hour:.3g} preemptions per node-hour ({what}: {self.preemptions} "
            f"over {self.node_hours:.1f} node-hours in the last {self.window_hours:.0f} h; "
            f"prior {self.prior:.3g} as {self.prior_node_hours:g} node-hour)"
        )


def estimate(
    state: ClusterState,
    prior: float,
    now: datetime | None = None,
    *,
    retention: timedelta = RETENTION,
    prior_node_hours: float = PRIOR_NODE_HOURS,
) -> PreemptionRate:
    """The posterior preemption rate of `state`'s preemptible nodes (see the module docstring)."""
    if prior < 0 or prior_node_hours <= 0:
        raise ValueError("prior >= 0 and prior_node_hours > 0")
    now = now or utcnow()
    start = now - retention
    if state.phases:
        start = max(start, state.phases[0][1])
    began: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    preempted: set[str] = set()
    for e in state.events:
        node = e.node or ""
        if not node.startswith(PREEMPTIBLE_PREFIX) or not start <= e.time <= now:
            continue
        if e.reason == NODE_ADDED:
            began.setdefault(node, e.time)
        elif e.reason in _ENDS:
            ended[node] = min(ended.get(node, e.time), e.time)
            if e.reason in (PREEMPTION_NOTIFIED, PREEMPTED):
                preempted.add(node)
    live = {n.name: n for n in state.preemptible_nodes}
    seconds = 0.0
    for node in set(began) | set(ended) | set(live):
        first = began.get(node)
        if first is None and node in live:
            running = [t for p, t in live[node].phases if p.endswith("RUNNING")]
            first = running[0] if running else None
        first = max(first or start, start)
        last = ended.get(node) or (now if node in live else None)
        if last is not None and last > first:
            seconds += (last - first).total_seconds()
    hours = seconds / 3600.0
    k = len(preempted)
    return PreemptionRate(
        per_node_hour=posterior(prior, prior_node_hours, k, hours),
        preemptions=k,
        node_hours=hours,
        prior=prior,
        prior_node_hours=prior_node_hours,
        window_hours=retention.total_seconds() / 3600.0,
    )


def run_estimate(
    state: ClusterState, setting: float, nodes: int, now: datetime | None = None
) -> tuple[float, float, str]:
    """The preemptions per hour of a run on `nodes` preemptible nodes of `state`'s cluster, and
    the line that says where it came from. A run stops when any of its nodes is preempted, so its
    rate is `nodes` times the node's; the `setting` (a rate of the run) is spread over its nodes
    as the node's prior. With nothing observed it is the setting. The weight is the estimate's
    in hours of the run: its prior and observed node-hours over the run's `nodes`. At a restart,
    call it again on the cluster read then, with the same setting."""
    nodes = max(1, int(nodes))
    rate = estimate(state, setting / nodes, now)
    run_rate = rate.per_node_hour * nodes
    weight = (rate.prior_node_hours + rate.node_hours) / nodes
    per_run = f"; x {nodes} nodes = {run_rate:.3g} per hour of the run" if nodes > 1 else ""
    line = f"{rate}{per_run} (setting {setting:g} per hour; cluster {state.name})"
    return run_rate, weight, line


def apply(
    train: TrainConfig,
    state: ClusterState,
    nodes: int,
    now: datetime | None = None,
    *,
    restart: int | None = None,
) -> tuple[TrainConfig, str | None]:
    """With ``checkpoint.auto``, `train` weighing the rate `state`'s cluster observed, its
    ``preemptions_per_hour`` setting being the prior (`run_estimate` on `nodes`): its policy's
    ``observed_preemptions_per_hour``, the estimate's weight and time, and
    ``preemptions_source``, the line that says where it came from (naming the `restart` it was
    re-read at, if any); with that line. Without ``auto``, `train` as it is and None."""
    policy = train.checkpoint
    if not policy.auto_interval:
        return train, None
    now = now or utcnow()
    rate, weight, line = run_estimate(state, policy.preemptions_per_hour, nodes, now)
    when = "" if restart is None else f" (the cluster re-read at restart {restart})"
    line = f"checkpoint.auto weighs{when} {line}"
    estimate = PreemptionEstimate(rate, line, weight, format_time(now))
    return replace(train, checkpoint=policy.with_estimate(estimate)), line
