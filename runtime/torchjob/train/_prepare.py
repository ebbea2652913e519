"""``prepare_model`` / ``prepare_data_loader`` / ``get_device``: the per-worker torch plumbing.

``prepare_data_loader`` rebuilds the user's DataLoader with every argument kept
and an :class:`ElasticDistributedSampler` in place of the default sampler, and
wraps it so batches land on the worker's device and the loader's position
(epoch, samples consumed) is known at each ``report``: that is what lets a
resumed run continue mid-epoch at another world size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from torchjob.checkpoint import DataPosition
from torchjob.launch import worker_info
from torchjob.train import _ddp, _session
from torchjob.train._sampler import ElasticDistributedSampler


def get_device() -> torch.device:
    """This worker's device: ``cuda:<local_rank>`` when it uses a GPU, else CPU."""
    info = worker_info()
    if info is not None:
        return torch.device(info.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _world() -> tuple[int, int]:
    s = _session.current()
    if s is not None:
        return s.world_size, s.world_rank
    info = worker_info()
    if info is not None:
        return info.world_size, info.rank
    return 1, 0


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to the device and wrap it in DDP (or FSDP) when the world has > 1 rank."""
    device = get_device()
    if isinstance(move_to_device, torch.device):
        device = move_to_device
    if move_to_device:
        model = model.to(device)
    world_size, _ = _world()
    kwargs = dict(parallel_strategy_kwargs or {})
    if world_size <= 1 or parallel_strategy is None:
        return model
    if parallel_strategy == "ddp":
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device])
        return _ddp.wrap(model, kwargs)
    if parallel_strategy == "fsdp":
        # FSDP2 (``fully_shard``) shards in place and, unlike FSDP1, also runs on CPU/gloo.
        from torch.distributed.fsdp import fully_shard

        _cpu_streams_for_fsdp2()
        fully_shard(model, **kwargs)
        return model
    raise ValueError(f"parallel_strategy must be 'ddp', 'fsdp' or None, got {parallel_strategy!r}")


def _cpu_streams_for_fsdp2() -> None:
    """torch < 2.7's FSDP2 calls ``record_event()`` / ``wait_event()`` on its streams, which
    ``torch.cpu.Stream`` (a stub for device-agnostic code) lacks: on CPU every FSDP2 forward
    raised ``AttributeError: 'Stream' object has no attribute 'record_event'`` (Debian
    trixie's torch 2.6, the runtime image's). CPU work runs in order on the calling thread and
    FSDP2 waits on the collectives' work handles itself, so an already-complete event is the
    right answer; a torch that has them is left alone."""

    def record_event(self: Any, event: Any = None) -> Any:
        return event or torch.cpu.Event()

    def wait_event(self: Any, event: Any) -> None:
        return None

    for name, fn in (("record_event", record_event), ("wait_event", wait_event)):
        if not hasattr(torch.cpu.Stream, name):
            setattr(torch.cpu.Stream, name, fn)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_to_device(b, device) for b in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: _to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    return batch


def _rebuild_with_sampler(
    loader: DataLoader[Any], sampler: DistributedSampler[Any]
) -> DataLoader[Any]:
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "sampler": sampler,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(loader.dataset, **kwargs)


class PreparedDataLoader:
    """The user's DataLoader, sharded, moving batches to the device, tracking its position."""

    def __init__(
        self,
        loader: DataLoader[Any],
        *,
        device: torch.device | None,
        world_size: int,
        resume: DataPosition | None,
    ) -> None:
        self._loader = loader
        self._device = device
        self._world_size = world_size
        self._resume = resume
        self._epoch_iterated: int | None = None
        self._consumed = 0
        self._complete = False
        self._resharded: tuple[int, int] | None = None

    @property
    def sampler(self) -> Any:
        """The sampler (``train_loader.sampler.set_epoch(epoch)`` works as with DistributedSampler)."""
        return self._loader.sampler

    @property
    def dataset(self) -> Any:
        return self._loader.dataset

    @property
    def batch_size(self) -> int | None:
        return self._loader.batch_size

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def _dataset_size(self) -> int:
        try:
            return len(self._loader.dataset)  # type: ignore[arg-type]
        except TypeError:
            return 0

    def reshard(self, world_size: int, rank: int) -> None:
        """The group re-formed under the loop (``recovery.in_place``): the next pass shards
        the data for ``world_size`` ranks as ``rank``; the pass in progress goes on as it
        was sharded."""
        self._resharded = (world_size, rank)

    def __iter__(self) -> Iterator[Any]:
        sampler = self._loader.sampler
        skip = 0
        if self._resharded is not None:
            self._world_size, rank = self._resharded
            self._resharded = None
            if isinstance(sampler, ElasticDistributedSampler):
                sampler.num_replicas, sampler.rank = self._world_size, rank
        if isinstance(sampler, ElasticDistributedSampler):
            # A new pass without set_epoch gets the next epoch's shuffle, not the same order again.
            if (
                not sampler.epoch_set_explicitly
                and self._epoch_iterated == sampler.epoch
                and self._complete
            ):
                sampler.set_epoch(sampler.epoch + 1)
            sampler.epoch_set_explicitly = False
            if self._resume is not None:
                skip = self._resume.skip_for_epoch(sampler.epoch)
                if sampler.epoch >= self._resume.epoch:
                    self._resume = None
            sampler.set_start(skip)
        self._epoch_iterated = int(getattr(sampler, "epoch", 0))
        self._consumed = skip
        self._complete = False
        per_step = (self._loader.batch_size or 1) * self._world_size
        for batch in self._loader:
            self._consumed += per_step
            yield _to_device(batch, self._device) if self._device is not None else batch
        self._complete = True

    def resume_from(self, position: DataPosition) -> None:
        """Continue from ``position`` at the next pass (what a loaded ``TrainState`` sets)."""
        self._resume = position

    def position(self) -> DataPosition:
        size = self._dataset_size()
        return DataPosition(
            epoch=self._epoch_iterated if self._epoch_iterated is not None else 0,
            samples_in_epoch=min(self._consumed, size) if size else self._consumed,
            epoch_complete=self._complete,
            world_size=self._world_size,
            dataset_size=size,
        )


def prepare_data_loader(
    data_loader: DataLoader[Any],
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> PreparedDataLoader:
    """Shard ``data_loader`` across workers and move its batches to the device.

    A ``DistributedSampler`` the user set is kept as is (Ray's behaviour); a
    custom batch sampler or an ``IterableDataset`` is left unsharded.
    """
    world_size, rank = _world()
    loader = data_loader
    default_batching = (
        isinstance(loader.batch_sampler, BatchSampler) and loader.batch_size is not None
    )
    if (
        add_dist_sampler
        and default_batching
        and not isinstance(loader.dataset, IterableDataset)
        and not isinstance(loader.sampler, DistributedSampler)
    ):
        sampler = ElasticDistributedSampler(
            loader.dataset,  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=isinstance(loader.sampler, RandomSampler),
            drop_last=loader.drop_last,
        )
        loader = _rebuild_with_sampler(loader, sampler)
    session = _session.current()
    index = len(session.loaders) if session is not None else 0
    resume = session.resume_position_for(index) if session is not None else None
    prepared = PreparedDataLoader(
        loader,
        device=get_device() if move_to_device else None,
        world_size=world_size,
        resume=resume,
    )
    if session is not None:
        session.loaders.append(prepared)
    return prepared
