"""A ``TorchTrainer`` run's experiment tracking: its callbacks, driven by the controller.

``RunConfig(callbacks=[...])`` takes Ray Tune's callbacks (``MLflowLoggerCallback``,
``TBXLoggerCallback``, ``WandbLoggerCallback``, any ``tune.Callback``); the run is one trial.
In a TorchJob's pod, ``$MLFLOW_TRACKING_URI`` alone turns MLflow on (unless
``TORCHJOB_MLFLOW_AUTOLOG=false``), with ``$MLFLOW_EXPERIMENT_NAME`` or the job's name as the
experiment. Only the driver that runs rank 0 calls them: every ``report()`` of rank 0 is a
result, every committed checkpoint an ``on_checkpoint`` with its URI.

The MLflow run id goes into the TorchJob's ``status.tracking`` (through the pod's
ServiceAccount, as ``status.progress`` does), and a later generation's rank 0 (another pod
after a restart, or a survivor) reads it there and resumes the same run: one TorchJob, one
MLflow run. The worker processes get ``MLFLOW_RUN_ID`` (and the tracking URI), so a
``setup_mlflow`` in the training function joins that run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchjob import contract
from torchjob.contract import PodEnv
from torchjob.launch.protocol import CheckpointLanded, Dispatcher, Report, ignore
from torchjob.tracking.callback import Callbacks, TrialInfo
from torchjob.tracking.mlflow import RUN_ID_ENV, TRACKING_URI_ENV, MLflowLoggerCallback
from torchjob.train.job_status import JobEndpoint

if TYPE_CHECKING:
    from torchjob.train.steps import TrainerSettings

log = logging.getLogger(__name__)

_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint as ``on_checkpoint`` gets it: its URI and index."""

    path: str
    index: int | None


def env_callbacks(
    callbacks: list[Any], pod: PodEnv | None, environ: Mapping[str, str] | None = None
) -> list[Any]:
    """``callbacks`` plus the MLflow callback a pod's env asks for (``$MLFLOW_TRACKING_URI``,
    not switched off by ``TORCHJOB_MLFLOW_AUTOLOG``), unless one is there already."""
    env = os.environ if environ is None else environ
    uri = env.get(TRACKING_URI_ENV)
    wanted = pod is not None and bool(uri)
    if not wanted or env.get(contract.MLFLOW_AUTOLOG, "").lower() in _OFF:
        return callbacks
    if any(isinstance(cb, MLflowLoggerCallback) for cb in callbacks):
        return callbacks
    assert pod is not None
    experiment = env.get("MLFLOW_EXPERIMENT_NAME") or pod.job_name
    return [*callbacks, MLflowLoggerCallback(uri, experiment_name=experiment)]


def status_tracking(trial: TrialInfo) -> dict[str, Any] | None:
    """The TorchJob's ``status.tracking`` for what the callbacks opened (camelCase wire)."""
    t = trial.tracking
    body = {
        "backend": "mlflow" if t.get("mlflow_run_id") or t.get("error") else None,
        "runId": t.get("mlflow_run_id"),
        "experimentId": t.get("mlflow_experiment_id"),
        "trackingUri": t.get("mlflow_tracking_uri"),
        "wandbRunId": t.get("wandb_run_id"),
        "error": t.get("error"),
    }
    body = {k: v for k, v in body.items() if v is not None}
    return body or None


def worker_env(trial: TrialInfo, callbacks: list[Any]) -> dict[str, str]:
    """What the worker processes need to join the driver's MLflow run (``setup_mlflow``)."""
    run_id = trial.tracking.get("mlflow_run_id")
    if not run_id:
        return {}
    env = {RUN_ID_ENV: str(run_id)}
    for cb in callbacks:
        if isinstance(cb, MLflowLoggerCallback) and cb.run_id(trial) == run_id and cb.tracking_uri:
            env[TRACKING_URI_ENV] = cb.tracking_uri
    return env


class RunTracking:
    """The callbacks of one ``fit``; a no-op without any."""

    def __init__(
        self,
        callbacks: list[Any] | None,
        *,
        name: str,
        run_url: str,
        config: Mapping[str, Any] | None,
        pod: PodEnv | None,
        endpoint: JobEndpoint | None,
    ) -> None:
        self.callbacks = Callbacks(env_callbacks(list(callbacks or []), pod))
        local = run_url if "://" not in run_url or run_url.startswith("file://") else None
        local = (
            local.removeprefix("file://") if local else str(Path.home() / "torchjob_results" / name)
        )
        self.trial = TrialInfo(trial_id=name, config=dict(config or {}), local_path=local)
        self.endpoint = endpoint
        self.started = False
        self.env: dict[str, str] = {}
        self.reports = 0
        self.endpoint_status: dict[str, Any] | None = None

    @classmethod
    def of(
        cls, trainer: TrainerSettings, name: str, run_url: str, pod: PodEnv | None, endpoint: Any
    ) -> RunTracking:
        rc = trainer.run_config
        config = trainer.train_loop_config
        return cls(
            rc.callbacks, name=name, run_url=run_url, config=config, pod=pod, endpoint=endpoint
        )

    def start(self) -> None:
        """Once, on the driver that runs rank 0, before its first generation."""
        if self.started or not self.callbacks:
            return
        self.started = True
        self.trial.tracking.update(self._published())
        self.callbacks.setup()
        self.callbacks.trial_start(self.trial)
        self.env = worker_env(self.trial, self.callbacks.callbacks)
        self._publish()

    def _published(self) -> dict[str, Any]:
        """The run an earlier generation of this TorchJob opened (``status.tracking``)."""
        if self.endpoint is None:
            return {}
        try:
            self.endpoint_status = self.endpoint.call("GET").get("status") or {}
            tracking = self.endpoint_status.get("tracking") or {}
        except (OSError, ValueError) as exc:
            log.warning("torchjob: cannot read status.tracking from %s: %s", self.endpoint.url, exc)
            return {}
        run_id = tracking.get("runId")
        if not run_id:
            return {}
        # The resumed run's steps go on from the reports of the generations before.
        step = ((self.endpoint_status or {}).get("progress") or {}).get("step")
        self.reports = step if isinstance(step, int) else 0
        return {"mlflow_run_id": run_id}

    def _publish(self) -> None:
        body = status_tracking(self.trial)
        if self.endpoint is None or body is None:
            return
        try:
            self.endpoint.call("PATCH", {"status": {"tracking": body}})
        except (OSError, ValueError) as exc:
            log.warning("torchjob: cannot write status.tracking to %s: %s", self.endpoint.url, exc)

    def event(self, event: object) -> None:
        """One launcher event of rank 0: a report (maybe with its checkpoint committed) or a
        checkpoint the background committer landed."""
        if self.started:
            _TRACKED(event, self)

    def end(self, *, failed: bool) -> None:
        if not self.started:
            return
        self.started = False
        self.callbacks.trial_end(self.trial, failed=failed)
        self.callbacks.experiment_end()


def _reported(e: Report, run: RunTracking) -> None:
    run.reports += 1
    result = {**e.metrics, "training_iteration": run.reports}
    run.callbacks.trial_result(run.trial, result)
    if e.checkpoint_index is not None:
        assert e.checkpoint_path is not None
        run.callbacks.checkpoint(run.trial, CheckpointRef(e.checkpoint_path, e.checkpoint_index))


def _landed(e: CheckpointLanded, run: RunTracking) -> None:
    run.callbacks.checkpoint(run.trial, CheckpointRef(e.path, e.index))


_TRACKED = Dispatcher[None]({Report: _reported, CheckpointLanded: _landed}, otherwise=ignore)
"""What experiment tracking follows of the launcher's events."""
