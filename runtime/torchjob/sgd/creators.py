"""RaySGD's conventions for the user's functions: how each creator is called and what it may
return, and which argument order a custom train or validation function uses.

:class:`torchjob.sgd.runner.Runner` builds a replica with these; they need no process group.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch


def split_optimizer_creator_result(created: Any, loss_creator: Any) -> tuple[Any, Any]:
    """``(criterion, optimizers)`` from what ``optimizer_creator`` returned.

    Seed 000's convention returns ``(criterion, optimizer)`` and passes no
    ``loss_creator``: the criterion comes first. Anything else must be one
    optimizer or a tuple/list of optimizers. Raises ``ValueError`` naming the
    creator (at ``PyTorchTrainer(...)``, when the workers build their replicas).
    """
    items = as_list(created)
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


def as_list(obj: Any) -> list[Any]:
    return list(obj) if isinstance(obj, tuple | list) else [obj]


def required_positional(fn: Callable[..., Any]) -> list[str]:
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
