"""``ray.air.session``: the session-era spelling of ``torchjob.train``'s worker functions.

``session.report(metrics, checkpoint=None)`` is :func:`torchjob.train.report`;
``session.get_checkpoint()`` is :func:`torchjob.train.get_checkpoint`; the
``get_*`` rank functions read :func:`torchjob.train.get_context`. Outside a
training function they describe a single process (rank 0 of 1).
"""

from __future__ import annotations

from typing import Any

from torchjob.train.checkpoint import Checkpoint
from torchjob.train.context import get_context


def report(metrics: dict[str, Any], *, checkpoint: Checkpoint | None = None) -> None:
    """Report metrics (rank 0's are kept) and optionally a checkpoint; collective, like
    :func:`torchjob.train.report`."""
    from torchjob.train._report import report as _report

    _report(metrics, checkpoint=checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from (the latest committed), or ``None`` on a fresh start."""
    from torchjob.train._report import get_checkpoint as _get_checkpoint

    return _get_checkpoint()


def get_world_size() -> int:
    return get_context().get_world_size()


def get_world_rank() -> int:
    return get_context().get_world_rank()


def get_local_rank() -> int:
    return get_context().get_local_rank()


def get_local_world_size() -> int:
    return get_context().get_local_world_size()


def get_node_rank() -> int:
    return get_context().get_node_rank()


def get_trial_name() -> str:
    return get_context().get_trial_name()


def get_experiment_name() -> str:
    return get_context().get_experiment_name()


def get_trial_dir() -> str:
    return get_context().get_trial_dir()


__all__ = [
    "get_checkpoint",
    "get_experiment_name",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_trial_dir",
    "get_trial_name",
    "get_world_rank",
    "get_world_size",
    "report",
]
