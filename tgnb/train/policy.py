"""When a training run checkpoints: periodically, on a signal, on a drain notice."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckpointPolicy:
    """The checkpoint settings of a run (the ``checkpoint:`` section of its YAML).

    Periodic saves happen every `every_steps` optimizer steps, every `every_seconds` seconds, or,
    with ``auto``, at the Young/Daly interval computed from the measured checkpoint cost and
    `preemptions_per_hour` (C is the measured training stall of a save). Periodic saves are
    asynchronous unless `async_save` is false. Independently, a SIGTERM (`on_signal`) or a drain notice
    (`watch_drain`) makes the run save at the next step boundary (agreed by every rank) and exit
    with `EXIT_PREEMPTED`. When checkpoints exist but none verifies, the run refuses to start again
    from step 0 unless `allow_fresh_start` is set.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    auto: bool = False
    preemptions_per_hour: float = 1.0
    keep_last: int = 2
    on_signal: bool = True
    watch_drain: bool = True
    drain_poll_seconds: float = 2.0
    requeue_on_drain: bool = True
    async_save: bool = True
    allow_fresh_start: bool = False
