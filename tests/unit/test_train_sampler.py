"""ElasticDistributedSampler and DataPosition: exact partitions, resume at another world size."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchjob.checkpoint import DataPosition
from torchjob.train._sampler import ElasticDistributedSampler


def _epoch(
    n: int, world: int, *, epoch: int = 0, start: int = 0, drop_last: bool = False
) -> list[list[int]]:
    out = []
    for rank in range(world):
        s = ElasticDistributedSampler(range(n), num_replicas=world, rank=rank, drop_last=drop_last)
        s.set_epoch(epoch)
        s.set_start(start)
        out.append(list(s))
        assert len(s) == len(out[-1])
    return out


@given(n=st.integers(1, 300), world=st.integers(1, 6), epoch=st.integers(0, 5))
@settings(max_examples=60, deadline=None)
def test_partition_is_exact(n: int, world: int, epoch: int) -> None:
    shards = _epoch(n, world, epoch=epoch)
    flat = [i for shard in shards for i in shard]
    assert set(flat) == set(range(n))  # nothing lost
    assert len(flat) - n == (-n) % world  # only the padding repeats (< world)
    assert len({len(s) for s in shards}) == 1  # equal shard sizes: no rank waits on a collective


def test_matches_torch_distributed_sampler_order() -> None:
    from torch.utils.data.distributed import DistributedSampler

    for rank in range(3):
        ours = ElasticDistributedSampler(range(50), num_replicas=3, rank=rank)
        theirs = DistributedSampler(range(50), num_replicas=3, rank=rank)
        ours.set_epoch(4)
        theirs.set_epoch(4)
        assert list(ours) == list(theirs)


@given(
    n=st.integers(20, 200),
    old_world=st.integers(1, 5),
    new_world=st.integers(1, 5),
    batch=st.integers(1, 8),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_resume_mid_epoch_at_other_world_size(
    n: int, old_world: int, new_world: int, batch: int, data: st.DataObject
) -> None:
    before = _epoch(n, old_world, epoch=2)
    steps = data.draw(st.integers(0, len(before[0]) // batch))
    consumed = [i for shard in before for i in shard[: steps * batch]]
    pos = DataPosition(
        epoch=2,
        samples_in_epoch=steps * batch * old_world,
        epoch_complete=False,
        world_size=old_world,
        dataset_size=n,
    )
    after = _epoch(n, new_world, epoch=2, start=pos.skip_for_epoch(2))
    rest = [i for shard in after for i in shard]
    seen = consumed + rest
    assert set(seen) == set(range(n))  # no sample skipped
    # Repeats come only from padding: at most (old_world - 1) + (new_world - 1).
    assert len(seen) - n <= (old_world - 1) + (new_world - 1)


@pytest.mark.parametrize(
    ("pos", "epoch", "skip"),
    [
        pytest.param(DataPosition(3, 40, False, 2, 100), 3, 40, id="same-epoch"),
        pytest.param(DataPosition(3, 40, False, 2, 100), 4, 0, id="next-epoch"),
        pytest.param(DataPosition(3, 100, True, 2, 100), 3, 0, id="complete"),
        pytest.param(DataPosition(3, 140, False, 2, 100), 3, 100, id="capped"),
    ],
)
def test_skip_for_epoch(pos: DataPosition, epoch: int, skip: int) -> None:
    assert pos.skip_for_epoch(epoch) == skip
