"""TensorBoard: Ray's ``TBXLoggerCallback`` (also named ``TensorBoardLoggerCallback``).

Every trial writes TensorBoard event files into its own directory (``trial.local_path``: a
Tune trial's ``trial_<id>`` folder; a ``TorchTrainer`` run's directory when its storage is
local, else ``~/torchjob_results/<run name>``): one scalar per numeric metric of each report,
tagged with the metric's name (nested dicts joined with ``/``) at step ``training_iteration``.
``tensorboard --logdir <storage_path>/<experiment>`` shows every trial side by side.

It writes with ``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard``
package (the ``tensorboard`` extra).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from torchjob.tracking.callback import LoggerCallback, TrackingError, TrialInfo, numeric_metrics

log = logging.getLogger("torchjob.tracking")

DEFAULT_ROOT = "~/torchjob_results"


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise TrackingError(
            "TBXLoggerCallback writes with torch.utils.tensorboard, which needs the tensorboard "
            "package: pip install 'torchjob[tensorboard]'"
        ) from exc
    return SummaryWriter


class TBXLoggerCallback(LoggerCallback):
    """Write each trial's reports as TensorBoard scalars into the trial's directory."""

    def __init__(self, flush_secs: int = 10) -> None:
        self.flush_secs = flush_secs
        self._writers: dict[TrialInfo, Any] = {}

    def setup(self, stop: Any = None, num_samples: int | None = None, **info: Any) -> None:
        _summary_writer()  # a missing package is named before the first trial

    def logdir(self, trial: TrialInfo) -> str:
        local = trial.local_path or os.path.join(DEFAULT_ROOT, str(trial))
        return str(Path(local).expanduser())

    def log_trial_start(self, trial: TrialInfo) -> None:
        if trial not in self._writers:
            writer = _summary_writer()
            self._writers[trial] = writer(log_dir=self.logdir(trial), flush_secs=self.flush_secs)

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        if trial not in self._writers:
            self.log_trial_start(trial)
        writer = self._writers[trial]
        step = int(result.get("training_iteration") or iteration)
        for key, value in numeric_metrics(result).items():
            if key != "training_iteration":
                writer.add_scalar(key, value, global_step=step)

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        writer = self._writers.pop(trial, None)
        if writer is not None:
            writer.close()

    def on_experiment_end(self, trials: list[TrialInfo], **info: Any) -> None:
        for trial in list(self._writers):
            self.log_trial_end(trial)


TensorBoardLoggerCallback = TBXLoggerCallback
