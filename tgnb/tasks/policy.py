"""When a training run checkpoints: periodically, on a signal, on a drain notice."""

from __future__ import annotations

from dataclasses import dataclass

#: The weight of the setting as the prior of a rate estimate, in node-hours of observation it
#: counts as (`tgnb.cloud.rates`).
PRIOR_NODE_HOURS = 1.0


@dataclass
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
    often. Periodic saves are asynchronous unless `async_save` is false.

    Independently, a SIGTERM (`on_signal`) or a drain notice (`watch_drain`) makes the run save at
    the next step boundary (agreed by every rank) and exit with `EXIT_PREEMPTED`. When checkpoints
    exist but none verifies, the run refuses to start again from step 0 unless `allow_fresh_start`
    is set.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    auto: bool = False
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

    @property
    def preemption_rate(self) -> float:
        """Preemptions per hour of the run that ``auto`` weighs: observed, else the setting."""
        observed = self.observed_preemptions_per_hour
        return self.preemptions_per_hour if observed is None else observed
