"""torchjob.air: the ``ray.air`` names of seed 004's era (``session``, ``ScalingConfig`` ...).

Code written for ``ray.air`` runs with the import changed::

    from torchjob.air import session, ScalingConfig  # was: from ray.air import ...

    def train_func():
        device = f"cuda:{session.get_local_rank()}"
        ...
        session.report({"loss": loss}, checkpoint=Checkpoint.from_directory(d))

Everything here is the same object as in :mod:`torchjob.train`: one runtime,
two spellings.
"""

from torchjob.air import session
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)
from torchjob.train.result import Result

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "TorchConfig",
    "session",
]
