"""Weights & Biases (optional: the ``wandb`` extra): the core of Ray's ``setup_wandb`` and
``WandbLoggerCallback``.

``WandbLoggerCallback`` opens one W&B run per trial from the driver (``name`` = the trial,
``group`` = the experiment, ``config`` = the trial's config), logs every report at step
``training_iteration`` and finishes the run with exit code 1 when the trial failed. The API key
comes from ``api_key``, ``api_key_file`` or ``$WANDB_API_KEY``; ``WANDB_MODE=offline`` writes
the runs under ``dir`` for a later ``wandb sync``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchjob.tracking.callback import LoggerCallback, TrackingError, TrialInfo, numeric_metrics


def import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise TrackingError("W&B tracking needs wandb: pip install 'torchjob[wandb]'") from exc
    return wandb


def set_api_key(api_key: str | None, api_key_file: str | None) -> None:
    """``$WANDB_API_KEY`` from the argument or the file (naming the file when it is missing)."""
    if api_key_file:
        path = Path(api_key_file).expanduser()
        if not path.is_file():
            raise TrackingError(f"W&B api_key_file {str(path)!r} does not exist")
        api_key = path.read_text().strip()
    if api_key:
        os.environ["WANDB_API_KEY"] = api_key


def init_run(config: Mapping[str, Any] | None, **kwargs: Any) -> Any:
    """``wandb.init`` with torchjob's defaults (a new run each call, quiet console)."""
    wandb = import_wandb()
    kwargs.setdefault("reinit", "create_new")
    kwargs.setdefault("settings", wandb.Settings(console="off", silent=True))
    return wandb.init(config=dict(config or {}), **kwargs)


class WandbLoggerCallback(LoggerCallback):
    """Ray's ``WandbLoggerCallback``: one W&B run per trial, from the driver."""

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        **kwargs: Any,
    ) -> None:
        self.project = project
        self.group = group
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = set(excludes or [])
        self.log_config = log_config
        self.kwargs = kwargs
        self._runs: dict[TrialInfo, Any] = {}

    def setup(self, stop: Any = None, num_samples: int | None = None, **info: Any) -> None:
        import_wandb()
        set_api_key(self.api_key, self.api_key_file)

    def log_trial_start(self, trial: TrialInfo) -> None:
        if trial in self._runs:
            return
        kwargs = dict(self.kwargs)
        if trial.local_path:
            Path(trial.local_path).mkdir(parents=True, exist_ok=True)
            kwargs.setdefault("dir", trial.local_path)
        run = init_run(
            trial.config,
            project=self.project,
            group=self.group,
            name=str(trial),
            **kwargs,
        )
        self._runs[trial] = run
        trial.tracking["wandb_run_id"] = run.id

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        run = self._runs.get(trial)
        if run is None:
            return
        step = int(result.get("training_iteration") or iteration)
        metrics = {
            k: v
            for k, v in numeric_metrics(result).items()
            if k not in self.excludes and k != "training_iteration"
        }
        if self.log_config:
            metrics.update({f"config/{k}": v for k, v in numeric_metrics(trial.config).items()})
        run.log(metrics, step=step)

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        run = self._runs.pop(trial, None)
        if run is not None:
            run.finish(exit_code=1 if failed else 0)

    def on_experiment_end(self, trials: list[TrialInfo], **info: Any) -> None:
        for trial in list(self._runs):
            self.log_trial_end(trial)
