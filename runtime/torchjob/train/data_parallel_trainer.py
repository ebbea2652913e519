"""``DataParallelTrainer``: seed 004's "more configurable" trainer, as ``ray.train.data_parallel_trainer``.

torchjob has one backend (torch.distributed), so this is :class:`TorchTrainer`
with Ray's argument names: ``backend_config`` is a :class:`TorchConfig`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import RunConfig, ScalingConfig, TorchConfig
from torchjob.train.trainer import TorchTrainer


class DataParallelTrainer(TorchTrainer):
    """``train_loop_per_worker`` on every worker of one torch.distributed group."""

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        backend_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        datasets: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if backend_config is not None and not isinstance(backend_config, TorchConfig):
            raise TypeError(
                "DataParallelTrainer(backend_config=...) must be a torchjob.train.TorchConfig "
                f"(torch.distributed is the only backend), got {type(backend_config).__name__}"
            )
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            torch_config=backend_config,
            resume_from_checkpoint=resume_from_checkpoint,
            datasets=datasets,
            metadata=metadata,
        )
