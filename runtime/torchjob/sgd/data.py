"""A replica's data: the loaders built from ``data_creator``, sharded over the process group,
and the batches of one pass.

Training data is sharded by a ``DistributedSampler`` (reshuffled each epoch); validation
data by a :class:`ShardSampler` (every sample exactly once over the group). A
``DataLoader`` the user built without a distributed sampler gets one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from torchjob.sgd.creators import as_list, required_positional


class ShardSampler(torch.utils.data.Sampler[int]):
    """Rank ``r`` of ``W`` takes indices ``r, r+W, r+2W ...``: no padding, no repeats, so a
    validation pass over the group sees each sample exactly once (``DistributedSampler`` pads
    the last round with repeats to make the shards equal)."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int) -> None:
        self.size = len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """Validation order does not change between epochs."""


class Pass:
    """The batches of one pass: an epoch of ``loader``, or ``num_steps`` batches cycling epochs.

    Re-iterable (each ``iter()`` replays the same pass, same order), so a
    custom train function may loop over it once per model, as seed 002's
    multi-model example does.
    """

    def __init__(self, loader: DataLoader[Any], epoch: int, num_steps: int | None) -> None:
        self.loader = loader
        self.epoch = epoch
        self.num_steps = num_steps

    def _epoch(self, epoch: int) -> Iterator[Any]:
        if isinstance(self.loader.sampler, DistributedSampler):
            self.loader.sampler.set_epoch(epoch)
        return iter(self.loader)

    def _cycle(self) -> Iterator[Any]:
        for e in itertools.count(self.epoch):
            empty = True
            for batch in self._epoch(e):
                empty = False
                yield batch
            if empty:
                return

    def __iter__(self) -> Iterator[Any]:
        if self.num_steps is None:
            return self._epoch(self.epoch)
        return itertools.islice(self._cycle(), self.num_steps)

    def __len__(self) -> int:
        return len(self.loader) if self.num_steps is None else self.num_steps


def make_loaders(
    data_creator: Callable[..., Any],
    batch_size: int,
    config: dict[str, Any],
    device: torch.device,
) -> tuple[DataLoader[Any] | None, DataLoader[Any] | None]:
    """``(train, validation)`` loaders from ``data_creator(config)`` or
    ``data_creator(batch_size, config)``; ``batch_size`` is per worker."""
    if len(required_positional(data_creator)) >= 2:
        data = data_creator(batch_size, config)
    else:
        data = data_creator(config)
    parts = as_list(data)
    if not 1 <= len(parts) <= 2:
        raise ValueError(
            "data_creator must return a train Dataset/DataLoader, or (train, validation); "
            f"got {len(parts)} values"
        )
    train = _loader(parts[0], batch_size, device, shuffle=True)
    val = (
        _loader(parts[1], batch_size, device, shuffle=False, exact=True)
        if len(parts) == 2
        else None
    )
    return train, val


def _sampler(dataset: Any, *, shuffle: bool, exact: bool) -> Any:
    if exact:
        # Validation: every sample exactly once over the group, none padded in.
        return ShardSampler(dataset, dist.get_world_size(), dist.get_rank())
    return DistributedSampler(dataset, shuffle=shuffle)


def _loader(
    obj: Any, batch_size: int, device: torch.device, *, shuffle: bool, exact: bool = False
) -> DataLoader[Any] | None:
    if obj is None:
        return None
    distributed = dist.is_available() and dist.is_initialized()
    if isinstance(obj, DataLoader):
        if not distributed or isinstance(obj.sampler, DistributedSampler | ShardSampler):
            return obj
        was_shuffled = isinstance(obj.sampler, RandomSampler)
        return DataLoader(
            obj.dataset,
            batch_size=obj.batch_size,
            sampler=_sampler(obj.dataset, shuffle=was_shuffled, exact=exact),
            num_workers=obj.num_workers,
            collate_fn=obj.collate_fn,
            pin_memory=obj.pin_memory,
            drop_last=obj.drop_last,
        )
    if isinstance(obj, Dataset):
        sampler: Any = _sampler(obj, shuffle=shuffle, exact=exact) if distributed else None
        return DataLoader(
            obj,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=shuffle if sampler is None else None,
            pin_memory=device.type == "cuda",
        )
    raise TypeError(
        f"data_creator returned a {type(obj).__name__}; expected a torch Dataset or DataLoader"
    )
