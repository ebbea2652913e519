"""``ray.air.integrations.wandb``: ``setup_wandb`` and ``WandbLoggerCallback`` (the ``wandb``
extra).

``setup_wandb(config)`` inside a training function returns the W&B run (``wandb.init``'s) on
rank 0 only (``rank_zero_only=True``); the other ranks get a stand-in whose every call does
nothing. ``project`` defaults to the run's name (in a pod: the TorchJob's), and every
``**kwargs`` goes to ``wandb.init``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchjob.tracking.mlflow import _NoopModule
from torchjob.tracking.wandb import WandbLoggerCallback, init_run, set_api_key
from torchjob.train.context import get_context


def setup_wandb(
    config: Mapping[str, Any] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: Any,
) -> Any:
    """Ray's ``setup_wandb``: a W&B run on rank 0, a no-op stand-in elsewhere."""
    context = get_context()
    if rank_zero_only and context.get_world_rank() != 0:
        return _NoopModule()
    set_api_key(api_key, api_key_file)
    kwargs.setdefault("project", context.get_experiment_name())
    kwargs.setdefault("name", context.get_trial_name())
    return init_run(config, **kwargs)


__all__ = ["WandbLoggerCallback", "setup_wandb"]
