"""``ray.tune.logger``: ``LoggerCallback`` and ``TBXLoggerCallback`` (TensorBoard event files per
trial; also named ``TensorBoardLoggerCallback``). Pass them as ``tune.run(callbacks=[...])``,
``tune.RunConfig(callbacks=[...])`` or ``torchjob.train.RunConfig(callbacks=[...])``."""

from torchjob.tracking.callback import LoggerCallback
from torchjob.tracking.tensorboard import TBXLoggerCallback, TensorBoardLoggerCallback

__all__ = ["LoggerCallback", "TBXLoggerCallback", "TensorBoardLoggerCallback"]
