"""The worker side of the creator API: one :class:`Runner` per worker process.

:class:`torchjob.sgd.PyTorchTrainer` sends the module-level functions below
through :meth:`torchjob.launch.WorkerGroup.execute`; the runner they build
lives in :func:`torchjob.launch.worker_state` between calls, holding this
replica's models (wrapped in ``DistributedDataParallel``), optimizers,
schedulers, loss and data loaders.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from torchjob.launch import worker_info, worker_state
from torchjob.sgd import steps

_STATE_KEY = "torchjob.sgd.runner"


@dataclass
class RunnerSpec:
    """Everything a worker needs to build its replica (sent once, cloudpickled)."""

    model_creator: Callable[..., Any]
    data_creator: Callable[..., Any]
    optimizer_creator: Callable[..., Any]
    loss_creator: Any
    scheduler_creator: Callable[..., Any] | None
    train_function: Callable[..., Any] | None
    validation_function: Callable[..., Any] | None
    config: dict[str, Any]
    batch_size_per_worker: int
    use_fp16: bool
    scheduler_step_freq: str
    grad_scaler_args: dict[str, Any]


def split_optimizer_creator_result(created: Any, loss_creator: Any) -> tuple[Any, Any]:
    """``(criterion, optimizers)`` from what ``optimizer_creator`` returned.

    Seed 000's convention returns ``(criterion, optimizer)`` and passes no
    ``loss_creator``: the criterion comes first. Anything else must be one
    optimizer or a tuple/list of optimizers. Raises ``ValueError`` naming the
    creator (at ``PyTorchTrainer(...)``, when the workers build their replicas).
    """
    items = _as_list(created)
    is_opt = [isinstance(o, torch.optim.Optimizer) for o in items]
    if (
        isinstance(created, tuple | list)
        and len(items) == 2
        and not is_opt[0]
        and is_opt[1]
        and callable(items[0])
    ):
        if loss_creator is not None:
            raise ValueError(
                "optimizer_creator returned (criterion, optimizer) and loss_creator= is given "
                "too: keep one source of the loss"
            )
        return items[0], items[1]
    bad = [f"{i}: {type(o).__name__}" for i, o in enumerate(items) if not is_opt[i]]
    if bad:
        raise ValueError(
            "optimizer_creator must return a torch.optim.Optimizer, several of them, or "
            f"(criterion, optimizer) (seed 000's convention); got non-optimizers at {bad}"
        )
    return None, created


def _as_list(obj: Any) -> list[Any]:
    return list(obj) if isinstance(obj, tuple | list) else [obj]


def _required_positional(fn: Callable[..., Any]) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]


def _positional(fn: Callable[..., Any]) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def config_last(fn: Callable[..., Any]) -> bool:
    """True for seed 002's older style ``f(models, iterator, criterion, optimizers, config)``.

    The documented style puts ``config`` first: ``f(config, model, iterator, ...)``.
    """
    names = _positional(fn)
    return bool(names) and names[0] != "config" and names[-1] == "config"


def accepts_info(fn: Callable[..., Any]) -> bool:
    try:
        return "info" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def make_loss(loss_creator: Any, config: dict[str, Any]) -> Any:
    """A loss class (``nn.MSELoss``) is instantiated; any other callable gets ``config``."""
    if loss_creator is None:
        return None
    if inspect.isclass(loss_creator) and issubclass(loss_creator, torch.nn.Module):
        return loss_creator()
    return loss_creator(config)


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


class _Pass:
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


class Runner:
    """One replica: built from the creators, then trained and validated pass by pass."""

    def __init__(self, spec: RunnerSpec) -> None:
        info = worker_info()
        self.spec = spec
        self.config = dict(spec.config)
        self.device = torch.device(info.device if info is not None else "cpu")
        self.rank = info.rank if info is not None else 0
        created = spec.model_creator(self.config)
        self.multi_model = isinstance(created, tuple | list)
        self.models: list[torch.nn.Module] = [m.to(self.device) for m in _as_list(created)]
        given = tuple(self.models) if self.multi_model else self.models[0]
        criterion, optimizers = split_optimizer_creator_result(
            spec.optimizer_creator(given, self.config), spec.loss_creator
        )
        self.multi_optimizer = isinstance(optimizers, tuple | list)
        self.optimizers: list[torch.optim.Optimizer] = _as_list(optimizers)
        self.criterion = (
            criterion if criterion is not None else make_loss(spec.loss_creator, self.config)
        )
        if isinstance(self.criterion, torch.nn.Module):
            self.criterion = self.criterion.to(self.device)
        self.schedulers: list[Any] = []
        self.multi_scheduler = False
        if spec.scheduler_creator is not None:
            opt_given = tuple(self.optimizers) if self.multi_optimizer else self.optimizers[0]
            schedulers = spec.scheduler_creator(opt_given, self.config)
            self.multi_scheduler = isinstance(schedulers, tuple | list)
            self.schedulers = _as_list(schedulers)
        self.train_loader, self.val_loader = self._make_data()
        needs_loss = spec.train_function is None or (
            spec.validation_function is None and self.val_loader is not None
        )
        if self.criterion is None and needs_loss:
            raise ValueError(
                "no loss: the default train/validation functions need one. Pass loss_creator= "
                "(e.g. nn.MSELoss), return (criterion, optimizer) from optimizer_creator, or "
                "pass train_function= and validation_function="
            )
        distributed = dist.is_available() and dist.is_initialized()
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.wrapped: list[torch.nn.Module] = [
            DistributedDataParallel(m, device_ids=device_ids)
            if distributed and any(p.requires_grad for p in m.parameters())
            else m
            for m in self.models
        ]
        scaler = None
        if spec.use_fp16 and self.device.type == "cuda":
            scaler = torch.amp.GradScaler("cuda", **spec.grad_scaler_args)
        self.context = steps.StepContext(
            device=self.device,
            use_fp16=spec.use_fp16,
            scheduler_step_freq=spec.scheduler_step_freq,
            scaler=scaler,
        )
        steps.set_context(self.context)
        self.epoch = 0

    # --- data ----------------------------------------------------------------------
    def _make_data(self) -> tuple[DataLoader[Any] | None, DataLoader[Any] | None]:
        creator = self.spec.data_creator
        if len(_required_positional(creator)) >= 2:
            data = creator(self.spec.batch_size_per_worker, self.config)
        else:
            data = creator(self.config)
        parts = _as_list(data)
        if not 1 <= len(parts) <= 2:
            raise ValueError(
                "data_creator must return a train Dataset/DataLoader, or (train, validation); "
                f"got {len(parts)} values"
            )
        train = self._loader(parts[0], shuffle=True)
        val = self._loader(parts[1], shuffle=False, exact=True) if len(parts) == 2 else None
        return train, val

    def _sampler(self, dataset: Any, *, shuffle: bool, exact: bool) -> Any:
        if exact:
            # Validation: every sample exactly once over the group, none padded in.
            return ShardSampler(dataset, dist.get_world_size(), dist.get_rank())
        return DistributedSampler(dataset, shuffle=shuffle)

    def _loader(self, obj: Any, *, shuffle: bool, exact: bool = False) -> DataLoader[Any] | None:
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
                sampler=self._sampler(obj.dataset, shuffle=was_shuffled, exact=exact),
                num_workers=obj.num_workers,
                collate_fn=obj.collate_fn,
                pin_memory=obj.pin_memory,
                drop_last=obj.drop_last,
            )
        if isinstance(obj, Dataset):
            sampler: Any = self._sampler(obj, shuffle=shuffle, exact=exact) if distributed else None
            return DataLoader(
                obj,
                batch_size=self.spec.batch_size_per_worker,
                sampler=sampler,
                shuffle=shuffle if sampler is None else None,
                pin_memory=self.device.type == "cuda",
            )
        raise TypeError(
            f"data_creator returned a {type(obj).__name__}; expected a torch Dataset or DataLoader"
        )

    def _batches(self, loader: DataLoader[Any], num_steps: int | None) -> _Pass:
        return _Pass(loader, self.epoch, num_steps)

    # --- what the user's functions see ------------------------------------------------
    def given_models(self) -> Any:
        return tuple(self.wrapped) if self.multi_model else self.wrapped[0]

    def given_optimizers(self) -> Any:
        return tuple(self.optimizers) if self.multi_optimizer else self.optimizers[0]

    def given_schedulers(self) -> Any:
        if not self.schedulers:
            return None
        return tuple(self.schedulers) if self.multi_scheduler else self.schedulers[0]

    # --- passes --------------------------------------------------------------------
    def train(self, num_steps: int | None, info: dict[str, Any] | None) -> dict[str, Any]:
        if self.train_loader is None:
            raise ValueError("data_creator returned no training data")
        fn = self.spec.train_function or steps.train
        iterator = self._batches(self.train_loader, num_steps)
        kwargs: dict[str, Any] = {"info": info or {}} if accepts_info(fn) else {}
        if config_last(fn):
            stats = fn(
                self.given_models(),
                iterator,
                self.criterion,
                self.given_optimizers(),
                self.config,
                **kwargs,
            )
        else:
            stats = fn(
                self.config,
                self.given_models(),
                iterator,
                self.criterion,
                self.given_optimizers(),
                self.given_schedulers(),
                **kwargs,
            )
        if self.spec.scheduler_step_freq == steps.SCHEDULER_STEP_EPOCH:
            for s in self.schedulers:
                s.step()
        self.epoch += 1
        result = dict(stats or {})
        result["epoch"] = self.epoch
        return result

    def validate(self, num_steps: int | None, info: dict[str, Any] | None) -> dict[str, Any]:
        if self.val_loader is None:
            raise ValueError("data_creator returned no validation data: return (train, validation)")
        fn = self.spec.validation_function or steps.validate
        iterator = self._batches(self.val_loader, num_steps)
        kwargs: dict[str, Any] = {"info": info or {}} if accepts_info(fn) else {}
        if config_last(fn):
            stats = fn(self.given_models(), iterator, self.criterion, self.config, **kwargs)
        else:
            stats = fn(
                self.config,
                self.given_models(),
                iterator,
                self.criterion,
                self.given_schedulers(),
                **kwargs,
            )
        return dict(stats or {})

    # --- state -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
        }
        if self.context.scaler is not None:
            state["grad_scaler"] = self.context.scaler.state_dict()
        cpu_state: dict[str, Any] = steps.to_device(state, torch.device("cpu"))
        return cpu_state

    def load(self, state: dict[str, Any]) -> None:
        for what, have in (("models", self.models), ("optimizers", self.optimizers)):
            if len(state[what]) != len(have):
                raise ValueError(
                    f"checkpoint holds {len(state[what])} {what}, the creators made {len(have)}"
                )
        for m, sd in zip(self.models, state["models"], strict=True):
            m.load_state_dict(sd)
        for o, sd in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(sd)
        for s, sd in zip(self.schedulers, state.get("schedulers", []), strict=False):
            s.load_state_dict(sd)
        if self.context.scaler is not None and "grad_scaler" in state:
            self.context.scaler.load_state_dict(state["grad_scaler"])
        self.epoch = int(state.get("epoch", 0))


# --- functions the driver sends (module-level so they pickle by reference) --------------
def setup(spec: RunnerSpec) -> None:
    worker_state()[_STATE_KEY] = Runner(spec)


def _runner() -> Runner:
    runner = worker_state().get(_STATE_KEY)
    if runner is None:
        raise RuntimeError("this worker has no PyTorchTrainer replica (setup did not run)")
    assert isinstance(runner, Runner)
    return runner


def train(num_steps: int | None, info: dict[str, Any] | None) -> dict[str, Any]:
    return _runner().train(num_steps, info)


def validate(num_steps: int | None, info: dict[str, Any] | None) -> dict[str, Any]:
    return _runner().validate(num_steps, info)


def state() -> dict[str, Any]:
    return _runner().state()


def load(state: dict[str, Any]) -> None:
    _runner().load(state)


def epoch() -> int:
    return _runner().epoch


def call_hook(hook: Callable[..., Any]) -> None:
    """Run the user's ``initialization_hook`` (it may take no argument, or a runner-like one)."""
    if _required_positional(hook):
        hook(worker_info())
    else:
        hook()
