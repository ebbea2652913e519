"""``ray.air.integrations.mlflow``: ``setup_mlflow`` and ``MLflowLoggerCallback``.

``setup_mlflow(config)`` inside a training function returns the ``mlflow`` module with a run
started, on rank 0 only (``rank_zero_only=True``); the other ranks get a stand-in whose every
call does nothing, so ``mlflow = setup_mlflow(config); mlflow.log_metric(...)`` logs once per
run. Inside a ``TorchTrainer`` whose driver already opened a run (an ``MLflowLoggerCallback``,
or ``$MLFLOW_TRACKING_URI`` in a TorchJob's pods) it joins that run, so the automatic metrics
and the function's own land in one place. The experiment defaults to the run's name
(``RunConfig.name``; in a pod the TorchJob's name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchjob.tracking.mlflow import MLflowLoggerCallback, _NoopModule, start_fluent_run
from torchjob.train.context import get_context


def setup_mlflow(
    config: Mapping[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: Mapping[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> Any:
    """Ray's ``setup_mlflow``: the ``mlflow`` module with an active run (rank 0), else a no-op
    stand-in. An unreachable server is logged with its URI and also gives the stand-in: the
    training goes on."""
    context = get_context()
    if rank_zero_only and context.get_world_rank() != 0:
        return _NoopModule()
    name = experiment_name or (None if experiment_id else context.get_experiment_name())
    return start_fluent_run(
        config,
        tracking_uri=tracking_uri,
        registry_uri=registry_uri,
        experiment_id=experiment_id,
        experiment_name=name,
        tracking_token=tracking_token,
        artifact_location=artifact_location,
        run_name=run_name,
        create_experiment_if_not_exists=create_experiment_if_not_exists or not experiment_name,
        tags=tags,
    )


__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
