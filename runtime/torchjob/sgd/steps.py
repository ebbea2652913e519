"""Per-worker training context and the default train/validate functions of the creator API.

These run inside worker processes. The default functions follow seed 002's
signatures (``train(config, model, train_iterator, criterion, optimizer,
scheduler=None)``), so a user's custom function can call them, or be written
the same way. Mixed precision is reached through :func:`autocast`,
:func:`backward` and :func:`step`, which are no-ops when ``use_fp16`` is off:
custom train functions that want fp16 use them instead of ``loss.backward()``
and ``optimizer.step()`` (the seed's "manage loss scaling manually").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

SCHEDULER_STEP_BATCH = "batch"
SCHEDULER_STEP_EPOCH = "epoch"
SCHEDULER_STEP_MANUAL = "manual"
SCHEDULER_STEP_FREQS = (SCHEDULER_STEP_BATCH, SCHEDULER_STEP_EPOCH, SCHEDULER_STEP_MANUAL)


@dataclass
class StepContext:
    """What the default functions need to know beyond the seed's arguments (one per worker)."""

    device: torch.device
    use_fp16: bool
    scheduler_step_freq: str
    scaler: Any = None
    """``torch.amp.GradScaler`` on CUDA with fp16; ``None`` otherwise (bf16 needs no scaling)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def autocast_dtype(self) -> torch.dtype:
        return torch.float16 if self.device.type == "cuda" else torch.bfloat16


_CONTEXT: list[StepContext] = []


def set_context(ctx: StepContext | None) -> None:
    _CONTEXT.clear()
    if ctx is not None:
        _CONTEXT.append(ctx)


def get_context() -> StepContext:
    """This worker's context; a CPU, full-precision one outside a PyTorchTrainer worker."""
    if _CONTEXT:
        return _CONTEXT[0]
    return StepContext(torch.device("cpu"), False, SCHEDULER_STEP_BATCH)


def autocast() -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for this worker's device when ``use_fp16`` is on, else a no-op.

    fp16 on CUDA; bf16 on CPU, where fp16 autocast is not supported.
    """
    ctx = get_context()
    if not ctx.use_fp16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=ctx.device.type, dtype=ctx.autocast_dtype)


def backward(loss: torch.Tensor) -> None:
    """``loss.backward()``, through the GradScaler when fp16 runs on CUDA."""
    scaler = get_context().scaler
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()  # type: ignore[no-untyped-call]


def step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``, unscaled and skipped on inf/nan by the GradScaler when there is one."""
    scaler = get_context().scaler
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors in (nested) tuples, lists and dicts to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def _single(obj: Any, what: str) -> Any:
    if isinstance(obj, tuple | list):
        if len(obj) != 1:
            raise ValueError(
                f"the default {what} handles one model, optimizer and scheduler; "
                f"got {len(obj)}: pass train_function= and validation_function= "
                "for multiple models (see the GAN example)"
            )
        return obj[0]
    return obj


def _split(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        "the default train/validation functions expect (features, target) batches; "
        f"got {type(batch).__name__}. Pass a train_function for other batch shapes."
    )


def train(
    config: dict[str, Any],
    model: Any,
    train_iterator: Iterable[Any],
    criterion: Any,
    optimizer: Any,
    scheduler: Any = None,
) -> dict[str, Any]:
    """One pass over ``train_iterator``: forward, loss, backward, step.

    Returns ``train_loss`` (mean over samples), ``last_train_loss``,
    ``num_samples`` and ``batch_count`` for this worker; the trainer
    aggregates them over workers. Steps the scheduler after every batch when
    ``scheduler_step_freq == "batch"``.
    """
    model = _single(model, "train function")
    optimizer = _single(optimizer, "train function")
    scheduler = _single(scheduler, "train function") if scheduler is not None else None
    if criterion is None:
        raise ValueError("the default train function needs a loss: pass loss_creator=")
    ctx = get_context()
    model.train()
    total_loss = 0.0
    num_samples = 0
    batch_count = 0
    last_loss = float("nan")
    for batch in train_iterator:
        features, target = _split(to_device(batch, ctx.device))
        with autocast():
            output = model(features)
            loss = criterion(output, target)
        optimizer.zero_grad()
        backward(loss)
        step(optimizer)
        if scheduler is not None and ctx.scheduler_step_freq == SCHEDULER_STEP_BATCH:
            scheduler.step()
        n = int(target.size(0)) if hasattr(target, "size") else 1
        last_loss = float(loss.item())
        total_loss += last_loss * n
        num_samples += n
        batch_count += 1
    return {
        "train_loss": total_loss / max(num_samples, 1),
        "last_train_loss": last_loss,
        "num_samples": num_samples,
        "batch_count": batch_count,
    }


def validate(
    config: dict[str, Any],
    model: Any,
    val_iterator: Iterable[Any],
    criterion: Any,
    scheduler: Any = None,
) -> dict[str, Any]:
    """Mean loss over ``val_iterator``; ``val_accuracy`` too for class-index targets."""
    model = _single(model, "validation function")
    if criterion is None:
        raise ValueError("the default validation function needs a loss: pass loss_creator=")
    ctx = get_context()
    model.eval()
    total_loss = 0.0
    num_samples = 0
    correct = 0
    classification = True
    with torch.no_grad():
        for batch in val_iterator:
            features, target = _split(to_device(batch, ctx.device))
            with autocast():
                output = model(features)
                loss = criterion(output, target)
            n = int(target.size(0))
            total_loss += float(loss.item()) * n
            num_samples += n
            is_class = (
                output.dim() == 2
                and output.size(1) > 1
                and target.dim() == 1
                and not torch.is_floating_point(target)
            )
            classification = classification and is_class
            if is_class:
                correct += int((output.argmax(dim=1) == target).sum().item())
    stats: dict[str, Any] = {
        "val_loss": total_loss / max(num_samples, 1),
        "num_samples": num_samples,
    }
    if classification and num_samples:
        stats["val_accuracy"] = correct / num_samples
    return stats
