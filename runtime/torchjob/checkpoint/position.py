"""The data position stored with every checkpoint, so a resume neither skips nor repeats data.

A prepared data loader's ``DistributedSampler`` draws the epoch's global order
from ``seed + epoch`` alone and hands rank ``r`` the entries ``r, r+W, r+2W ...``.
After ``s`` steps of batch ``B`` the ranks together consumed exactly the first
``s * B * W`` entries of that order, whatever ``W`` was. So ``(epoch,
samples_in_epoch)`` is a world-size-free position: a resumed run with ``W'``
workers skips that prefix and strides the rest by ``W'``.

Documented bound: the sampler pads an epoch to a multiple of the world size
(or, with ``drop_last``, drops the remainder), so per epoch at most ``W - 1``
samples are seen twice (or not at all), as with ``DistributedSampler`` itself.
A resume adds no other skip or repeat.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DataPosition:
    """Where one data loader stood when a checkpoint was taken."""

    epoch: int
    samples_in_epoch: int
    """Samples of ``epoch`` consumed by all ranks together (global, not per rank)."""
    epoch_complete: bool
    world_size: int
    dataset_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataPosition:
        return cls(
            epoch=int(data["epoch"]),
            samples_in_epoch=int(data["samples_in_epoch"]),
            epoch_complete=bool(data["epoch_complete"]),
            world_size=int(data["world_size"]),
            dataset_size=int(data["dataset_size"]),
        )

    def skip_for_epoch(self, epoch: int) -> int:
        """Global samples to skip at the start of ``epoch`` when resuming from here."""
        if epoch != self.epoch or self.epoch_complete:
            return 0
        return min(self.samples_in_epoch, self.dataset_size)
