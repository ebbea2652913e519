"""``PreparedDataLoader.reshard``: a group re-formed under the loop (``recovery.in_place``)
shards the next pass for its new world size and rank; the pass in progress goes on as it was
sharded."""

from __future__ import annotations

from torch.utils.data import DataLoader

from torchjob.train._prepare import PreparedDataLoader
from torchjob.train._sampler import ElasticDistributedSampler


def test_the_next_pass_is_sharded_for_the_new_group() -> None:
    data = list(range(12))
    sampler = ElasticDistributedSampler(data, num_replicas=3, rank=2, shuffle=False)
    prepared = PreparedDataLoader(
        DataLoader(data, batch_size=1, sampler=sampler), device=None, world_size=3, resume=None
    )
    passing = iter(prepared)
    first = int(next(passing))
    prepared.reshard(2, 1)  # rank 2 of 3 became rank 1 of 2 in the middle of the pass
    assert [first, *(int(b) for b in passing)] == [2, 5, 8, 11]
    assert prepared.position().world_size == 3
    assert [int(b) for b in prepared] == [1, 3, 5, 7, 9, 11]
    assert prepared.position().world_size == 2
