"""The shard mirror's pure parts: a rank's box (``torch.chunk``'s split, as DTensor's) and the
choice of the report to rebuild (never mixing records of different reports or generations).
The multi-process behaviour is in tests/runtime/test_shard_mirror.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from torchjob.train.recovery.shard_mirror import box
from torchjob.train.recovery.shard_rebuild import Fallback, Plan, choose


class _Mesh:
    def __init__(self, world: int, rank: int) -> None:
        self.world, self.rank = world, rank

    def size(self) -> int:
        return self.world

    def get_local_rank(self) -> int:
        return self.rank


@pytest.mark.parametrize("n", [0, 1, 3, 9, 10, 11])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_box_is_torch_chunk_of_the_sharded_dim(n: int, world: int) -> None:
    full = torch.arange(n * 2).view(n, 2)
    chunks = torch.chunk(full, world, dim=0) if n else ()
    for rank in range(world):
        local, offset = box((n, 2), _Mesh(world, rank), (Shard(0),))
        piece = chunks[rank] if rank < len(chunks) else full[n:]
        assert local == tuple(piece.shape)
        if piece.numel():
            assert offset == (int(piece[0, 0]) // 2, 0)
        assert box((n, 2), _Mesh(world, rank), (Replicate(),)) == ((n, 2), (0, 0))


def _rec(old: int, world: int, gen: int, index: int, own: bool) -> tuple[Any, ...]:
    return (old, world, gen, index, own, [] if old == 0 else None)


def test_choose_takes_the_newest_report_every_old_rank_is_held_for() -> None:
    # Two old ranks; a survivor holds both at report 8, the other only its own at 8.
    plan = choose([[_rec(0, 2, 2, 8, True), _rec(1, 2, 2, 8, False)], [_rec(1, 2, 2, 8, True)]])
    assert isinstance(plan, Plan)
    assert (plan.index, plan.generation, plan.holders, plan.from_mirror) == (8, 2, {0: 0, 1: 1}, ())


def test_choose_never_pairs_records_of_different_reports() -> None:
    # Rank 0's own record is at 8, rank 1's at 7 (and its mirror of 0 at 7): report 7 is the
    # newest whole one; 8 would pair rank 0's shards of 8 with rank 1's of 7.
    plan = choose([[_rec(0, 2, 2, 8, True)], [_rec(1, 2, 2, 7, True), _rec(0, 2, 2, 7, False)]])
    assert isinstance(plan, Plan) and (plan.index, plan.holders) == (7, {0: 1, 1: 1})


def test_choose_never_pairs_records_of_different_generations() -> None:
    # The same report index and world size from two generations (a fallback replayed it).
    split = choose([[_rec(0, 2, 1, 5, True)], [_rec(1, 2, 3, 5, True)]])
    assert isinstance(split, Fallback) and split.index == 5
    assert choose([[], None]) is None
