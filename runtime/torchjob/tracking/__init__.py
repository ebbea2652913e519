"""torchjob.tracking: experiment tracking (MLflow, TensorBoard, Weights & Biases).

The callback interface (Ray Tune's ``Callback`` / ``LoggerCallback`` hook names) and the
loggers behind Ray's names, which ``torchjob.air.integrations`` and ``torchjob.tune.logger``
export: ``MLflowLoggerCallback``, ``TBXLoggerCallback``, ``WandbLoggerCallback``. No backend
is imported until a callback is used (the ``mlflow``, ``tensorboard`` and ``wandb`` extras).
See docs/platform.md, "Experiment tracking".
"""

from torchjob.tracking.callback import Callback, Callbacks, LoggerCallback, TrialInfo
from torchjob.tracking.mlflow import MLflowLoggerCallback, TrackingError
from torchjob.tracking.tensorboard import TBXLoggerCallback, TensorBoardLoggerCallback
from torchjob.tracking.wandb import WandbLoggerCallback

__all__ = [
    "Callback",
    "Callbacks",
    "LoggerCallback",
    "MLflowLoggerCallback",
    "TBXLoggerCallback",
    "TensorBoardLoggerCallback",
    "TrackingError",
    "TrialInfo",
    "WandbLoggerCallback",
]
