"""MLflow: the logger callback (Ray's ``MLflowLoggerCallback``) and the core of ``setup_mlflow``.

``MLflowLoggerCallback`` opens one MLflow run per trial (a ``TorchTrainer`` run is one trial)
from the driver, logs the trial's config as parameters, every ``report()``'s numeric metrics at
step ``training_iteration``, each committed checkpoint's URI as the tags
``torchjob.checkpoint`` (the latest) and ``torchjob.checkpoint.<n>``, and ends the run
``FINISHED`` or ``FAILED``. A trial whose ``tracking`` names a run (a TorchJob's
``status.tracking.runId``) resumes that run, so a job's restarts are one MLflow run.

The calls after the run is open go through one background thread: a slow or lost tracking
server never holds up the driver. Before the run opens, the server is probed once (a 5 s
HTTP request); when it cannot be reached the callback logs an error that names the URI,
records it (``error``, and ``status.tracking.error`` in a TorchJob), and the training goes on
without MLflow.

``mlflow`` (or ``mlflow-skinny``, enough for a remote tracking server) is imported lazily: the
``mlflow`` extra.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from torchjob.tracking.callback import (
    LoggerCallback,
    TrackingError,
    TrialInfo,
    flat_params,
    numeric_metrics,
)

__all__ = ["TrackingError", "flat_params", "numeric_metrics"]

log = logging.getLogger("torchjob.tracking")

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_NAME_ENV = "MLFLOW_EXPERIMENT_NAME"
RUN_ID_ENV = "MLFLOW_RUN_ID"
PROBE_TIMEOUT_S = 5.0
FLUSH_TIMEOUT_S = 60.0


def redact(uri: str) -> str:
    """``uri`` without the user and password of ``https://user:pass@host`` (safe to show)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise TrackingError(
            "MLflow tracking needs the mlflow client: pip install 'torchjob[mlflow]'"
        ) from exc
    return mlflow


def resolve_uri(tracking_uri: str | None) -> str:
    """The argument, else ``$MLFLOW_TRACKING_URI``, else MLflow's default."""
    if tracking_uri:
        return tracking_uri
    if os.environ.get(TRACKING_URI_ENV):
        return os.environ[TRACKING_URI_ENV]
    return str(import_mlflow().get_tracking_uri())


def check_reachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`TrackingError` naming ``uri`` when an HTTP(S) tracking server does not
    answer; any HTTP answer counts (MLflow's own retries would wait minutes)."""
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme not in ("http", "https"):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(
            f"MLflow tracking server {redact(uri)} cannot be reached: {reason}"
        ) from exc


class _Background:
    """One thread that runs the logging calls in order; ``flush`` waits for them."""

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="torchjob-mlflow", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], Any]) -> None:
        self._queue.put(task)

    def flush(self, timeout_s: float) -> bool:
        done = threading.Event()
        self._queue.put(done.set)
        return done.wait(timeout_s)

    def _run(self) -> None:
        while (task := self._queue.get()) is not None:
            try:
                task()
            except Exception as exc:
                self._on_error(exc)


class MLflowLoggerCallback(LoggerCallback):
    """Ray's ``MLflowLoggerCallback``: one MLflow run per trial, from the driver.

    ``tracking_uri`` defaults to ``$MLFLOW_TRACKING_URI``; ``experiment_name`` to
    ``$MLFLOW_EXPERIMENT_NAME``, else MLflow's default experiment. ``save_artifact=True``
    uploads the trial's local directory at its end.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        self.error: TrackingError | None = None
        """Why this callback logs nothing (the server could not be reached), else None."""
        self.experiment_id: str | None = None
        self._client: Any = None
        self._runs: dict[TrialInfo, str] = {}
        self._background: _Background | None = None
        self._failed_once = False

    # --- setup -----------------------------------------------------------------------------
    def setup(self, stop: Any = None, num_samples: int | None = None, **info: Any) -> None:
        if self._client is not None or self.error is not None:
            return
        uri = ""
        try:
            uri = resolve_uri(self.tracking_uri)
            self.tracking_uri = uri
            check_reachable(uri)
            if self.tracking_token:
                os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri, registry_uri=self.registry_uri)
            self.experiment_id = _experiment_id(client, self.experiment_name)
        except TrackingError as exc:
            self._disable(exc)
            return
        except Exception as exc:
            self._disable(TrackingError(f"MLflow tracking at {redact(uri)}: {exc}"))
            return
        self._client = client
        self._background = _Background(self._background_error)

    def _disable(self, error: TrackingError) -> None:
        self.error = error
        log.error("torchjob: %s; training goes on without MLflow tracking", error)

    def _background_error(self, exc: Exception) -> None:
        if not self._failed_once:
            self._failed_once = True
            log.error(
                "torchjob: MLflow tracking at %s failed: %s (later failures are not logged)",
                redact(self.tracking_uri or ""),
                exc,
            )

    def run_id(self, trial: TrialInfo) -> str | None:
        """The MLflow run of ``trial``, once it started."""
        return self._runs.get(trial)

    # --- the trial's run -------------------------------------------------------------------
    def log_trial_start(self, trial: TrialInfo) -> None:
        if self._client is None:
            self.setup()
        if self._client is None:
            trial.tracking["error"] = str(self.error)
            return
        if trial in self._runs:
            return
        client = self._client
        run_id = self._resume(trial)
        resumed = run_id is not None
        if run_id is None:
            tags = {**{k: str(v) for k, v in self.tags.items()}, "trial_name": str(trial)}
            run = client.create_run(self.experiment_id, run_name=str(trial), tags=tags)
            run_id = run.info.run_id
        self._runs[trial] = run_id
        trial.tracking.update(
            mlflow_run_id=run_id,
            mlflow_experiment_id=self.experiment_id,
            mlflow_tracking_uri=redact(self.tracking_uri or ""),
        )
        if not resumed and not self.log_params_on_trial_end:
            self._log_params(run_id, trial.config)

    def _resume(self, trial: TrialInfo) -> str | None:
        """The run named by ``trial.tracking`` when it exists, set running again."""
        run_id = trial.tracking.get("mlflow_run_id")
        if not run_id:
            return None
        try:
            self._client.get_run(run_id)
        except Exception as exc:
            log.warning(
                "torchjob: MLflow run %s cannot be resumed (%s); starting a new one", run_id, exc
            )
            return None
        self._client.update_run(run_id, status="RUNNING")
        return str(run_id)

    def _log_params(self, run_id: str, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flat_params(config).items()]
        for i in range(0, len(params), 100):
            batch = params[i : i + 100]
            self._submit(functools.partial(self._client.log_batch, run_id, params=batch))

    def _submit(self, task: Callable[[], Any]) -> None:
        if self._background is not None:
            self._background.submit(task)

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        run_id = self._runs.get(trial)
        if run_id is None:
            return
        import time

        from mlflow.entities import Metric

        step = int(result.get("training_iteration") or iteration)
        now = int(time.time() * 1000)
        metrics = [
            Metric(k, v, now, step)
            for k, v in numeric_metrics(result).items()
            if k != "training_iteration"
        ]
        for i in range(0, len(metrics), 1000):
            batch = metrics[i : i + 1000]
            self._submit(functools.partial(self._client.log_batch, run_id, metrics=batch))

    def log_trial_save(self, trial: TrialInfo, checkpoint: Any = None) -> None:
        run_id = self._runs.get(trial)
        if run_id is None or checkpoint is None:
            return
        from mlflow.entities import RunTag

        path = str(getattr(checkpoint, "path", checkpoint))
        index = getattr(checkpoint, "index", None)
        tags = [RunTag("torchjob.checkpoint", path)]
        if index is not None:
            tags.append(RunTag(f"torchjob.checkpoint.{index}", path))
        self._submit(lambda: self._client.log_batch(run_id, tags=tags))

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        run_id = self._runs.pop(trial, None)
        if run_id is None:
            return
        if self.log_params_on_trial_end:
            self._log_params(run_id, trial.config)
        if self.should_save_artifact and trial.local_path:
            path = trial.local_path
            self._submit(lambda: self._client.log_artifacts(run_id, path))
        status = "FAILED" if failed else "FINISHED"
        self._submit(lambda: self._client.set_terminated(run_id, status=status))
        self.flush()

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until what was logged so far reached the server (or ``timeout_s`` passed)."""
        if self._background is not None and not self._background.flush(timeout_s):
            log.error(
                "torchjob: MLflow tracking at %s did not take the last logs within %gs",
                redact(self.tracking_uri or ""),
                timeout_s,
            )

    def on_experiment_end(self, trials: list[TrialInfo], **info: Any) -> None:
        self.flush()


def _experiment_id(client: Any, name: str | None) -> str:
    """The id of experiment ``name`` (created when missing); MLflow's default without a name."""
    if not name:
        return "0"
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    return str(client.create_experiment(name))


class _NoopModule:
    """What ``setup_mlflow`` returns where it does nothing: every attribute and call is a no-op."""

    def __getattr__(self, item: str) -> _NoopModule:
        return _NoopModule()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False


def start_fluent_run(
    config: Mapping[str, Any] | None,
    *,
    tracking_uri: str | None,
    registry_uri: str | None,
    experiment_id: str | None,
    experiment_name: str | None,
    tracking_token: str | None,
    artifact_location: str | None,
    run_name: str | None,
    create_experiment_if_not_exists: bool,
    tags: Mapping[str, Any] | None,
) -> Any:
    """``setup_mlflow`` on the process that logs: MLflow's active run, or ``_NoopModule`` with
    an error naming the URI when the server cannot be reached. Inside a ``TorchTrainer`` whose
    driver opened a run (``$MLFLOW_RUN_ID``), this run is that one."""
    mlflow = import_mlflow()
    uri = resolve_uri(tracking_uri)
    try:
        check_reachable(uri)
    except TrackingError as exc:
        log.error("torchjob: %s; setup_mlflow returns a no-op stand-in", exc)
        return _NoopModule()
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    mlflow.set_tracking_uri(uri)
    if registry_uri:
        mlflow.set_registry_uri(registry_uri)
    joined = os.environ.get(RUN_ID_ENV)
    if not joined:
        if experiment_id:
            mlflow.set_experiment(experiment_id=experiment_id)
        elif experiment_name:
            client = mlflow.tracking.MlflowClient(tracking_uri=uri)
            if client.get_experiment_by_name(experiment_name) is None:
                if not create_experiment_if_not_exists:
                    raise TrackingError(
                        f"MLflow experiment {experiment_name!r} does not exist at {redact(uri)}: "
                        "pass create_experiment_if_not_exists=True"
                    )
                client.create_experiment(experiment_name, artifact_location=artifact_location)
            mlflow.set_experiment(experiment_name)
    if mlflow.active_run() is None:
        mlflow.start_run(run_name=None if joined else (run_name or experiment_name), tags=tags)
    elif tags:
        mlflow.set_tags(dict(tags))
    if config and not joined:
        mlflow.log_params(flat_params(config))
    return mlflow
