"""When a training run checkpoints: periodically, on a signal, on a drain notice.

`CheckpointPolicy` is part of the run's contract: frozen, and valid once built (a bad value is a
`TrainConfigError` naming the key); `CheckpointPolicy.parse` is the one reading of it from plain
data (the config's ``checkpoint:``, ``protect(checkpoint={...})``, ``$TGNB_CHECKPOINT``). The
preemption rate tgnb estimates for ``auto`` is a value of its own (`PreemptionEstimate`), applied
with `CheckpointPolicy.with_estimate`; `posterior` is the one update of such a rate by what was
seen (the cluster's events at launch, `tgnb.cloud.rates`; the run's own record at a restart,
`tgnb.train.rates`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.runs.durations import check_seconds

#: The weight of the setting as the prior of a rate estimate, in node-hours of observation it
#: counts as (`tgnb.cloud.rates`).
PRIOR_NODE_HOURS = 1.0
#: Upper bound of a step count (a count past it is a typo, not a plan).
MAX_STEPS = 10_000_000
#: The longest interval ``checkpoint.auto`` chooses, in seconds of training: what a node lost with
#: no notice loses at most, whatever the rates and save times it weighs.
AUTO_MAX_SECONDS = 1800.0


def posterior(rate: float, weight_hours: float, events: int, hours: float) -> float:
    """The Gamma-Poisson posterior mean of an event rate: a Gamma(rate·w, w) prior (`rate` per
    hour, worth `weight_hours` w of observation) updated by `events` seen over `hours`:
    (rate·w + events) / (w + hours)."""
    return (rate * weight_hours + events) / (weight_hours + hours)


@dataclass(frozen=True)
class PreemptionEstimate:
    """The preemptions per hour of a run that tgnb estimated (`per_hour`), the line that says
    where it came from (`source`), its weight in hours of the run (`weight_hours`) and when it
    was made (`as_of`, RFC 3339, UTC): what a restart updates with `updated`."""

    per_hour: float
    source: str
    weight_hours: float | None = None
    as_of: str | None = None

    def updated(self, events: int, hours: float, source: str, as_of: str) -> PreemptionEstimate:
        """This estimate with `events` preemptions over `hours` more of the run folded in."""
        weight = self.weight_hours or 0.0
        return PreemptionEstimate(
            posterior(self.per_hour, weight, events, hours), source, weight + hours, as_of
        )


def _unknown(kind: str, key: str, known: list[str]) -> TrainConfigError:
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return TrainConfigError(f"unknown {kind} '{key}'.{hint}")


def bounded(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TrainConfigError(f"'{name}' must be an integer, not {value!r:.40}.")
    if value < low:
        raise TrainConfigError(f"{name} must be at least {low}, not {value}.")
    if value > high:
        raise TrainConfigError(f"{name} must be at most {high}, not {value:.3g}.")


@dataclass(frozen=True)
class CheckpointPolicy:
    """The checkpoint settings of a run (the ``checkpoint:`` section of its YAML).

    Periodic saves happen every `every_steps` optimizer steps, every `every_seconds` seconds, or,
    with ``auto``, at the interval that costs training least
    (`tgnb.train.checkpoint.young_daly_seconds`, from the measured stall and write time of a save).
    It weighs `failures_per_hour`, interruptions with no notice (a crash, a node lost outright: they
    lose the work since the last complete checkpoint), against `preemptions_per_hour`, those with
    one (SIGTERM, a drain: they lose nothing, but the save in flight is waited for; with both
    `on_signal` and `watch_drain` off they count as failures). On preemptible nodes tgnb sets
    `observed_preemptions_per_hour` at launch from the rate the cluster's ``node_lifecycle_events``
    show, the setting being the prior (`tgnb.cloud.rates`), and says so in `preemptions_source`;
    `preemption_rate` is the one weighed. At each restart it is updated with what was seen since:
    the local engine reads the cluster again (`tgnb.cloud.rates.apply`); on Slurm and
    Kubernetes, whose nodes hold no API key, the runtime folds the run's own preemptions and hours
    since `preemptions_as_of` into the launch estimate, worth `preemptions_weight_hours`
    (`tgnb.train.rates`). The default, one failure per ten
    hours of a run, is far more than hardware alone (Llama 3's 54-day run on 2,048 eight-GPU nodes
    saw 419 unexpected interruptions: one per 6,300 node-hours); raise it where runs crash more
    often. ``auto`` is on by default and gives way to `every_steps` / `every_seconds` when one is
    given; its interval is never longer than `AUTO_MAX_SECONDS`, so a node lost with no notice
    loses at most that much training (docs/recovery-bounds.md). Periodic saves are asynchronous
    unless `async_save` is false.

    Independently, a SIGTERM (`on_signal`) or a drain notice (`watch_drain`) makes the run save at
    the next step boundary (agreed by every rank) and exit with `EXIT_PREEMPTED`. When checkpoints
    exist but none verifies, the run refuses to start again from step 0 unless `allow_fresh_start`
    is set.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    #: On by default: with neither `every_steps` nor `every_seconds` given, periodic saves come at
    #: Young/Daly's interval, at most `AUTO_MAX_SECONDS` of training apart.
    auto: bool = True
    preemptions_per_hour: float = 1.0
    #: Set by tgnb at launch from what the cluster observed, the setting being the prior
    #: (`tgnb.prelaunch.observed_preemption_rate`); None: the setting is weighed.
    observed_preemptions_per_hour: float | None = None
    #: Where `observed_preemptions_per_hour` came from, in words.
    preemptions_source: str | None = None
    #: The estimate's weight, in hours of the run it counts as (its Gamma prior's rate: prior and
    #: observed node-hours over the run's nodes); set with `observed_preemptions_per_hour`.
    preemptions_weight_hours: float | None = None
    #: When the estimate was made (RFC 3339, UTC): a restart folds in the run's own record after it.
    preemptions_as_of: str | None = None
    failures_per_hour: float = 0.1
    keep_last: int = 2
    on_signal: bool = True
    watch_drain: bool = True
    drain_poll_seconds: float = 2.0
    #: Under a user's own sbatch script, the runtime requeues its job after a drain notice; under
    #: the script tgnb renders, the script requeues on the recovery policy's resume codes.
    requeue_on_drain: bool = True
    async_save: bool = True
    allow_fresh_start: bool = False

    def __post_init__(self) -> None:
        self._check()

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None, kind: str = "checkpoint key") -> CheckpointPolicy:
        """A policy from plain data: unknown keys are errors naming the close matches."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise TrainConfigError("'checkpoint' must be a mapping such as {every_steps: 50}.")
        known = [f.name for f in dataclasses.fields(cls)]
        for key in raw:
            if key not in known:
                raise _unknown(kind, str(key), known)
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def merged(self, raw: Mapping[str, Any], kind: str = "checkpoint key") -> CheckpointPolicy:
        """This policy with `raw`'s keys over it (checked as `parse` checks them)."""
        return CheckpointPolicy.parse({**self.to_dict(), **raw}, kind)

    @property
    def estimate(self) -> PreemptionEstimate | None:
        """tgnb's estimate of the run's preemption rate, when it made one."""
        rate = self.observed_preemptions_per_hour
        if rate is None:
            return None
        source = self.preemptions_source or f"{rate:g} preemptions per hour (observed)"
        return PreemptionEstimate(
            rate, source, self.preemptions_weight_hours, self.preemptions_as_of
        )

    def with_estimate(self, estimate: PreemptionEstimate) -> CheckpointPolicy:
        """This policy weighing `estimate` (the setting stays the prior it was made from)."""
        return dataclasses.replace(self, **estimate_fields(estimate))

    @property
    def auto_interval(self) -> bool:
        """Whether ``auto`` chooses the periodic interval: on, and no interval given."""
        return self.auto and not (self.every_steps or self.every_seconds)

    @property
    def preemption_rate(self) -> float:
        """Preemptions per hour of the run that ``auto`` weighs: observed, else the setting."""
        observed = self.observed_preemptions_per_hour
        return self.preemptions_per_hour if observed is None else observed

    def _check(self) -> None:
        """Flags are booleans, counts whole, rates and periods positive (no preemptions at all is
        fine)."""
        flags = ("auto", "on_signal", "watch_drain", "requeue_on_drain", "async_save")
        for key in (*flags, "allow_fresh_start"):
            if not isinstance(getattr(self, key), bool):
                raise TrainConfigError(f"checkpoint.{key} must be true or false.")
        if self.every_steps is not None:
            bounded("checkpoint.every_steps", self.every_steps, 1, MAX_STEPS)
        bounded("checkpoint.keep_last", self.keep_last, 1, 1000)
        for key in ("preemptions_source", "preemptions_as_of"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise TrainConfigError(f"checkpoint.{key} must be text (or left out).")
        weight = self.preemptions_weight_hours
        if weight is not None and not (_number(weight) and weight > 0):
            raise TrainConfigError(
                f"checkpoint.preemptions_weight_hours must be a number above 0, not {weight!r:.40}."
            )
        if self.every_seconds is not None:  # durations: each has its range (runs.durations)
            check_seconds("checkpoint.every_seconds", self.every_seconds, TrainConfigError)
        check_seconds("checkpoint.drain_poll_seconds", self.drain_poll_seconds, TrainConfigError)
        rates = ("preemptions_per_hour", "observed_preemptions_per_hour")
        for key in (*rates, "failures_per_hour"):
            value = getattr(self, key)
            if value is None and key == "observed_preemptions_per_hour":
                continue
            zero_ok = key in rates
            if not (_number(value) and (value > 0 or (zero_ok and value == 0))):
                raise TrainConfigError(
                    f"checkpoint.{key} must be a number {'>= 0' if zero_ok else 'above 0'}, "
                    f"not {value!r:.40}."
                )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def estimate_fields(estimate: PreemptionEstimate) -> dict[str, Any]:
    """The ``checkpoint:`` keys that carry `estimate` (how the node's config file holds it)."""
    return {
        "observed_preemptions_per_hour": estimate.per_hour,
        "preemptions_source": estimate.source,
        "preemptions_weight_hours": estimate.weight_hours,
        "preemptions_as_of": estimate.as_of,
    }
