"""The service's regime, modelled: the asynchronous RL loop (`tgnb.tinker.async_rl`) with each
resource on its own GPU, from the seconds each piece of a run took (that module's docstring says
why and how the model is checked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tgnb.tinker.async_rl import RunResult


@dataclass(frozen=True)
class PieceSeconds:
    """What each piece of one run's steps cost (seconds, measured from the client): step k's
    batch of rollouts, the rewards and data made from it, its training, saving version k+1's
    sampler weights and opening the sampler on them."""

    sampling: list[float]
    rewards: list[float]
    training: list[float]
    saving: list[float]
    opening: list[float]

    @classmethod
    def of(cls, r: RunResult) -> PieceSeconds:
        n = len(r.history)
        if n < 2 or len(r.opening) != n or len(r.arrived) != n:
            raise ValueError("the run has no timeline of two steps or more to model from")
        return cls(
            sampling=[b - a for a, b in r.generator[:n]],
            rewards=[t0 - a for (t0, _), a in zip(r.trainer, r.arrived, strict=True)],
            training=[t1 - t0 for t0, t1 in r.trainer],
            saving=[o0 - p0 for (p0, _), (o0, _) in zip(r.publishing, r.opening, strict=True)],
            opening=[o1 - o0 for o0, o1 in r.opening],
        )


def modelled_seconds(pieces: PieceSeconds, max_off_policy: int) -> list[float]:
    """When each step ends (seconds from the first batch's submission) with each resource on its
    own GPU: the loop of `run` with `max_off_policy` versions of lag, each piece taking its
    measured seconds. Sampling holds the sampler's GPU, one batch at a time; training and saving
    are the trainer's; the rewards are the client's. A batch is submitted when the loop submits
    it (once the version it samples is published), a step trains once its batch arrived, and a
    version is published after its step: its sampler is opened alongside the batch in flight (the
    opening is the service creating a session) and is ready no sooner than that batch is done
    (the sampler's resource computes one thing at a time). Fed a run's own pieces, it replays
    that run (`RunResult.steps_per_minute`), asynchronous runs included."""
    n = len(pieces.training)
    clock, sampler_free = 0.0, 0.0
    batches: list[tuple[float, float]] = []  # each batch's (start, end) on the sampler's GPU
    ends: list[float] = []
    for step in range(n):
        while len(batches) < n and len(batches) <= step + max_off_policy:
            start = max(clock, sampler_free)
            sampler_free = start + pieces.sampling[len(batches)]
            batches.append((start, sampler_free))
        clock = max(clock, batches[step][1]) + pieces.rewards[step] + pieces.training[step]
        clock += pieces.saving[step] + pieces.opening[step]
        clock = next((b for a, b in batches if a < clock < b), clock)  # the batch in flight
        ends.append(clock)
    return ends


def modelled_steps_per_minute(pieces: PieceSeconds, max_off_policy: int) -> float:
    """`RunResult.steps_per_minute` of `modelled_seconds` (after the first step, likewise)."""
    ends = modelled_seconds(pieces, max_off_policy)
    return 60.0 * (len(ends) - 1) / (ends[-1] - ends[0])
