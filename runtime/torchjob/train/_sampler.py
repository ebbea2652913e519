"""A DistributedSampler whose epoch order does not depend on the world size and can resume mid-epoch.

The order of epoch ``e`` is ``randperm(len(dataset), seed + e)`` (torch's own
``DistributedSampler`` order); rank ``r`` of ``W`` takes every ``W``-th entry from
``r``. ``set_start(k)`` drops the first ``k`` entries, which is exactly what all
ranks consumed together before a checkpoint (see ``torchjob.checkpoint.position``),
so a resume at another world size continues where the data stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch
from torch.utils.data.distributed import DistributedSampler


class ElasticDistributedSampler(DistributedSampler):  # type: ignore[type-arg]
    def __init__(
        self,
        dataset: Sized,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            dataset,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.start = 0
        self.epoch_set_explicitly = False

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.epoch_set_explicitly = True

    def set_start(self, start: int) -> None:
        """Skip the first ``start`` entries of this epoch's global order (one epoch only)."""
        self.start = max(0, start)

    def _global_order(self) -> list[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order: list[int] = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        return order[self.start :]

    def _sizes(self, remaining: int) -> tuple[int, int]:
        w = self.num_replicas
        total = (remaining // w) * w if self.drop_last else math.ceil(remaining / w) * w
        return total, total // w

    def __iter__(self) -> Iterator[int]:
        order = self._global_order()
        total, _ = self._sizes(len(order))
        if total > len(order) and order:
            order = (order * math.ceil(total / len(order)))[:total]
        else:
            order = order[:total]
        return iter(order[self.rank : total : self.num_replicas])

    def __len__(self) -> int:
        remaining = max(0, len(self.dataset) - self.start)  # type: ignore[arg-type]
        return self._sizes(remaining)[1]
