"""torchjob.train: Ray Train's ``TorchTrainer`` API, without Ray.

Code written for ``ray.train`` runs with the imports changed to ``torchjob.train``
(and ``ray.train.torch`` to ``torchjob.train.torch``)::

    import torchjob.train
    from torchjob.train import Checkpoint, RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer, prepare_data_loader, prepare_model

Torch is imported lazily: ``import torchjob.train`` stays cheap until a torch
function is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)
from torchjob.train.context import TrainContext, get_context, is_primary
from torchjob.train.errors import TrainingFailedError, TrainingStoppedError
from torchjob.train.result import Result

if TYPE_CHECKING:
    from torchjob.train import torch
    from torchjob.train._prepare import get_device, prepare_data_loader, prepare_model
    from torchjob.train._register import register_state
    from torchjob.train._report import (
        get_checkpoint,
        get_preemption_info,
        report,
        should_stop,
    )
    from torchjob.train.data_parallel_trainer import DataParallelTrainer
    from torchjob.train.recovery.preemption import PreemptionInfo
    from torchjob.train.state import StateCheckpoint, TrainState
    from torchjob.train.trainer import TorchTrainer

_LAZY = {
    "report": "torchjob.train._report",
    "get_checkpoint": "torchjob.train._report",
    "should_stop": "torchjob.train._report",
    "prepare_model": "torchjob.train._prepare",
    "prepare_data_loader": "torchjob.train._prepare",
    "get_device": "torchjob.train._prepare",
    "register_state": "torchjob.train._register",
    "get_preemption_info": "torchjob.train._report",
    "PreemptionInfo": "torchjob.train.recovery.preemption",
    "TorchTrainer": "torchjob.train.trainer",
    "DataParallelTrainer": "torchjob.train.data_parallel_trainer",
    "TrainState": "torchjob.train.state",
    "StateCheckpoint": "torchjob.train.state",
}


def __getattr__(name: str) -> Any:
    if name == "torch":
        return importlib.import_module("torchjob.train.torch")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchjob.train' has no attribute {name!r}")


__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "PreemptionInfo",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StateCheckpoint",
    "TorchConfig",
    "TorchTrainer",
    "TrainContext",
    "TrainState",
    "TrainingFailedError",
    "TrainingStoppedError",
    "get_checkpoint",
    "get_context",
    "get_device",
    "get_preemption_info",
    "is_primary",
    "prepare_data_loader",
    "prepare_model",
    "register_state",
    "report",
    "should_stop",
    "torch",
]
