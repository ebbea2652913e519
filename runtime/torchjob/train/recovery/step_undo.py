"""Undoing the step a loss broke, in place, without the restore point's copy of the model.

When a peer is lost during DDP's gradient all-reduce, the in-place comm hook hands back the
local gradients (``recovery.in_place``) and the loop goes on to ``optimizer.step()``. Applied,
that step moves every survivor's parameters by its own gradients alone: their state is no
longer the job's, and the survivors had to roll back to the restore point, up to ``k``
reports old where its cadence copies every ``k``-th report (``recovery.cadence``), and do
those steps again (bench/results/2026-12-06s: 24 steps redone in 10 node losses at k = 5-8,
against 6 at k = 1).

Instead, a registered optimizer's ``step()`` does nothing once the group is broken (a step
pre-hook drops the gradients: ``SGD``, ``Adam``, ``AdamW`` and the other torch optimizers
skip a parameter without one, its state untouched). Then the parameters and the optimizer
state are exactly those of the last report, and what else the broken step moved is small:
the models' buffers (batch norm's statistics), the optimizers' hyperparameters (a
scheduler's learning rate), the other registered entries (the loop's counters, a
scheduler), the random generators. :func:`mark` copies those at every report (a few KiB for
most models: no parameter, no optimizer state); :func:`undo` puts them back when the loop
parks, and the live state is that of the report again, where the loop redoes the step as
it would after a rollback to a restore point taken there (``in_place.Parked.exact``).

Where an optimizer step went through since the report (a loop that reports every few
steps), or the loss met the loop elsewhere, nothing is undone here and the group rolls back
to the restore point as before. Optimizers that step the registered models must be
registered too: one that is not is not stopped, and a step it takes with local gradients
is not undone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from torchjob.checkpoint.rng import capture_rng, restore_rng

_ATTR = "_torchjob_step_undo"


@dataclass
class _Steps:
    """The registered optimizers' steps since the last report (:func:`mark`)."""

    applied: int = 0
    voided: int = 0


@dataclass
class _Light:
    """What a step moves besides the parameters and the optimizer state, at one report."""

    run: str
    index: int
    buffers: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    other: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)


_STEPS = _Steps()
_LIGHT: list[_Light | None] = [None]


def watch(registered: Mapping[str, Any], broken: Callable[[], object]) -> None:
    """Hook every registered torch optimizer (once): its ``step()`` does nothing while
    ``broken()`` says the group is broken, and counts the steps it takes otherwise."""
    import torch

    def before(opt: Any, _args: Any, _kwargs: Any) -> None:
        if broken() is not None:
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = None
            _STEPS.voided += 1

    def after(_opt: Any, _args: Any, _kwargs: Any) -> None:
        if broken() is None:
            _STEPS.applied += 1

    for opt in registered.values():
        if isinstance(opt, torch.optim.Optimizer) and not getattr(opt, _ATTR, False):
            opt.register_step_pre_hook(before)
            opt.register_step_post_hook(after)
            setattr(opt, _ATTR, True)


def _module(v: Any) -> Any:
    import torch

    if isinstance(v, torch.nn.parallel.DistributedDataParallel):
        v = v.module
    return v if isinstance(v, torch.nn.Module) else None


def light_of(registered: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """Copies of what a step moves besides parameters and optimizer state: (each model's
    persistent buffers, each optimizer's hyperparameters, every other entry's state)."""
    import torch

    buffers: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    other: dict[str, Any] = {}
    for k, v in registered.items():
        module = _module(v)
        if module is not None:
            kept = module.state_dict()
            buffers[k] = {n: b.detach().clone() for n, b in module.named_buffers() if n in kept}
        elif isinstance(v, torch.optim.Optimizer):
            groups[k] = [
                {n: copy.deepcopy(x) for n, x in g.items() if n != "params"} for g in v.param_groups
            ]
        else:
            state = v.state_dict() if callable(getattr(v, "state_dict", None)) else v
            other[k] = copy.deepcopy(state)
    return buffers, groups, other


def mark(run: str, index: int, registered: Mapping[str, Any]) -> None:
    """At report ``index`` of ``run`` (counted): copy what :func:`undo` puts back, and count
    the optimizers' steps from here."""
    buffers, groups, other = light_of(registered)
    _LIGHT[0] = _Light(run, index, buffers, groups, other, capture_rng())
    _STEPS.applied = _STEPS.voided = 0


def forget() -> None:
    """A new group, or state loaded from elsewhere: nothing to undo until the next report."""
    _LIGHT[0] = None
    _STEPS.applied = _STEPS.voided = 0


def undoable(run: str, index: int) -> bool:
    """Whether the live state goes back to report ``index`` of ``run`` by :func:`undo`: every
    optimizer step since it did nothing (at least one: the loop stepped, and a step that went
    through would have moved the parameters), and its light copy is held."""
    light = _LIGHT[0]
    return (
        light is not None
        and (light.run, light.index) == (run, index)
        and _STEPS.voided > 0
        and _STEPS.applied == 0
    )


def undo(run: str, index: int, registered: MutableMapping[str, Any]) -> bool:
    """Put the live state back at report ``index`` (True), where :func:`undoable`."""
    light = _LIGHT[0]
    if light is None or not undoable(run, index):
        return False
    import torch

    with torch.no_grad():
        for k, saved in light.buffers.items():
            module = _module(registered[k])
            here = dict(module.named_buffers())
            for n, b in saved.items():
                here[n].copy_(b)
    for k, saved_groups in light.groups.items():
        for group, saved in zip(registered[k].param_groups, saved_groups, strict=True):
            group.update(copy.deepcopy(saved))
    for k, state in light.other.items():
        v = registered[k]
        if callable(getattr(v, "load_state_dict", None)):
            v.load_state_dict(copy.deepcopy(state))
        else:
            registered[k] = copy.deepcopy(state)
    restore_rng(light.rng)
    _STEPS.voided = 0
    return True


__all__ = ["forget", "light_of", "mark", "undo", "undoable", "watch"]
