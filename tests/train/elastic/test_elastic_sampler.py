"""`tgnb.train.ElasticSampler` alone: after `k` batches on each of `W` ranks, a resume at any other
world size hands out exactly the samples of the epoch not yet drawn, each once, and its saved
position (``state_dict``) is the samples drawn by all ranks together."""

from __future__ import annotations

import itertools

import pytest

from tgnb.train.order import ElasticSampler, elastic


@pytest.mark.parametrize(("size", "saved", "world", "batches"), [
    (64, 2, 1, 3), (64, 1, 2, 5), (64, 2, 3, 2), (50, 3, 2, 4), (64, 4, 1, 0),
])  # fmt: skip
def test_a_resume_at_another_world_size_draws_the_rest_of_the_epoch(
    size: int, saved: int, world: int, batches: int
) -> None:
    data = list(range(size))
    ranks = [ElasticSampler(data, num_replicas=saved, rank=r, seed=3) for r in range(saved)]
    drawn: list[int] = []
    for sampler in ranks:
        sampler.set_epoch(2)
        drawn += itertools.islice(iter(sampler), batches * 4)  # batch 4 per rank, no workers
    state = ranks[0].state_dict()
    assert state == {"epoch": 2, "samples": batches * 4 * saved}
    rest: list[int] = []
    for r in range(world):
        again = ElasticSampler(data, num_replicas=world, rank=r, seed=3)
        again.load_state_dict(state)
        mine = list(again)
        assert len(again) * world >= len(drawn) + len(mine)  # the loader's length: the epoch's
        rest += mine
    assert len(set(drawn)) == len(drawn) and not set(drawn) & set(rest)
    assert set(drawn) | set(rest) == set(data)  # every sample; twice only the plain pad at the end
    assert len(rest) - len(set(rest)) < world


def test_the_next_epoch_is_the_plain_samplers_and_only_torchs_sampler_is_converted() -> None:
    from torch.utils.data import DistributedSampler, RandomSampler

    data = list(range(20))
    resumed = ElasticSampler(data, num_replicas=2, rank=1, seed=0)
    resumed.resume_at(0, 8)
    plain = DistributedSampler(data, num_replicas=2, rank=1, seed=0)
    for sampler in (resumed, plain):
        sampler.set_epoch(1)
    assert list(resumed) == list(plain) and len(resumed) == len(plain)
    assert elastic(plain) is plain and isinstance(plain, ElasticSampler)
    assert elastic(RandomSampler(data)) is None
