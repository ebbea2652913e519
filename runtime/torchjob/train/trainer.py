"""``TorchTrainer``: Ray Train's trainer, run by torchjob's own launcher.

``fit()`` hands the run to ``torchjob.train.controller.Controller``, a state machine
with one strategy per mode: local processes on a laptop (restart, shrink, grow back
within ``FailureConfig``), a TorchJob pod (fail fast: restarts are the operator's
job, and the next generation's pods resume from the checkpoint), or a KeepSurvivors
pod (follow the job's generations in this process).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

from torchjob.contract import PodEnv
from torchjob.launch import zygote
from torchjob.rules.trial import merged_loop_config, trial_config
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import RunConfig, ScalingConfig, TorchConfig
from torchjob.train.controller import Controller
from torchjob.train.result import Result


class TorchTrainer:
    """Runs ``train_loop_per_worker(config)`` on every worker of a torch.distributed group."""

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        torch_backend: TorchConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        datasets: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if datasets:
            raise ValueError("datasets= (Ray Data) is not supported; use prepare_data_loader")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.torch_config = torch_config or torch_backend or TorchConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.metadata = metadata or {}

    def fit(self) -> Result:
        """Train to completion and return the :class:`Result`.

        Raises :class:`TrainingFailedError` (root cause first) when the failure
        budget is spent, :class:`TrainingStoppedError` after a SIGTERM stop.
        """
        # The zygote first: before fit() starts a thread or asks torch.cuda anything.
        zygote.prepare(zygote.modules_of(self.train_loop_per_worker))
        return Controller(_as_trial(self), PodEnv.from_env()).run()


def _as_trial(trainer: TorchTrainer) -> TorchTrainer:
    """In a tuning trial's TorchJob (``TORCHJOB_TUNE_CONFIG``): the trial's config merged into
    ``train_loop_config``; elsewhere the trainer itself."""
    config = trial_config(os.environ)
    if config is None:
        return trainer
    trial = copy.copy(trainer)
    trial.train_loop_config = merged_loop_config(trainer.train_loop_config, config)
    return trial
