"""What the controller hands every worker for one generation (``WorkerSpec``), and what each
worker hands back (``WorkerOutcome``).

Plain values, below both sides: the controller and ``_worker_loop`` build and read them, and
``_shared_result`` reads the spec, without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerSpec:
    train_func: Callable[..., Any]
    config: dict[str, Any] | None
    storage_url: str | None
    experiment_name: str
    run_path: str
    num_to_keep: int | None
    score_attribute: str | None
    score_order: str
    resume_from: str | None
    """An explicit ``resume_from_checkpoint`` directory, used when the run has none committed."""
    share_result: bool = False
    """Pod mode with several pods: rank 0 sends its final result to every rank (see
    ``torchjob.train._shared_result``) so every pod's ``fit()`` returns the same ``Result``."""
    history_before: tuple[dict[str, Any], ...] = ()
    """Rank 0's reports of earlier generations of this ``fit`` (KeepSurvivors)."""
    async_commit: bool = True
    """``CheckpointConfig.async_commit``: rank 0 commits reported checkpoints in the background."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Set in every worker's environment before the training function runs (the driver's
    MLflow run: ``MLFLOW_RUN_ID``, so ``setup_mlflow`` joins it)."""


@dataclass(frozen=True)
class WorkerOutcome:
    rank: int
    stopped: bool
    reports: int
    stopped_at_report: int | None
    shared: dict[str, Any] | None = None
    """The final result rank 0 shared (``WorkerSpec.share_result``), else None."""
