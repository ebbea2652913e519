"""The worker side of the creator API: one :class:`Runner` per worker process.

:class:`torchjob.sgd.PyTorchTrainer` sends the module-level functions below
through :meth:`torchjob.launch.WorkerGroup.execute`; the runner they build
lives in :func:`torchjob.launch.worker_state` between calls, holding this
replica's models (wrapped in ``DistributedDataParallel``), optimizers,
schedulers, loss and data loaders (built by ``torchjob.sgd.data``, from the creators
called as ``torchjob.sgd.creators`` says).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from torchjob.launch import worker_info, worker_state
from torchjob.sgd import steps
from torchjob.sgd.creators import (
    accepts_info,
    as_list,
    config_last,
    make_loss,
    required_positional,
    split_optimizer_creator_result,
)
from torchjob.sgd.data import Pass, make_loaders

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
        self.models: list[torch.nn.Module] = [m.to(self.device) for m in as_list(created)]
        given = tuple(self.models) if self.multi_model else self.models[0]
        criterion, optimizers = split_optimizer_creator_result(
            spec.optimizer_creator(given, self.config), spec.loss_creator
        )
        self.multi_optimizer = isinstance(optimizers, tuple | list)
        self.optimizers: list[torch.optim.Optimizer] = as_list(optimizers)
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
            self.schedulers = as_list(schedulers)
        self.train_loader, self.val_loader = make_loaders(
            spec.data_creator, spec.batch_size_per_worker, self.config, self.device
        )
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

    def _batches(self, loader: DataLoader[Any], num_steps: int | None) -> Pass:
        return Pass(loader, self.epoch, num_steps)

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
    if required_positional(hook):
        hook(worker_info())
    else:
        hook()
