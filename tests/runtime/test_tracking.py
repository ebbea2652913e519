"""Experiment tracking against a real MLflow tracking server (tests/tracking.py starts one) and
real TensorBoard event files read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

import logging
import os
import tempfile
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tests.kube import wait_for
from tests.tracking import closed_port_uri

import torchjob.train
from torchjob import tune
from torchjob.air.integrations.mlflow import MLflowLoggerCallback, setup_mlflow
from torchjob.checkpoint import CheckpointStorage
from torchjob.train import RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer
from torchjob.tune.logger import TBXLoggerCallback


def _scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _runs(uri: str, experiment: str) -> list[Any]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} at {uri}"
    return list(client.search_runs([exp.experiment_id]))


def tracked_loop(config: dict[str, Any]) -> None:
    """Three steps, each reported with a checkpoint; ``setup_mlflow`` logs once per run."""
    mlflow = setup_mlflow(config)
    rank = torchjob.train.get_context().get_world_rank()
    if rank != 0:
        assert not isinstance(mlflow, types.ModuleType), "rank != 0 gets the no-op stand-in"
        assert mlflow.log_metric("ignored", 1.0) is None
    model = torch.nn.Linear(2, 1)
    for step in range(3):
        loss = float(model(torch.ones(1, 2)).sum() ** 2) + 1.0 / (step + 1)
        mlflow.log_metric("from_setup_mlflow", float(step), step=step)
        with tempfile.TemporaryDirectory() as d:
            torch.save({"step": step}, os.path.join(d, "state.pt"))
            torchjob.train.report(
                {"loss": loss, "step": step, "phase": "train"},
                checkpoint=torchjob.train.Checkpoint.from_directory(d),
            )


def test_torch_trainer_logs_reports_and_checkpoint_uris_to_mlflow_and_tensorboard(
    mlflow_server: str, tmp_path: Path
) -> None:
    result = TorchTrainer(
        tracked_loop,
        train_loop_config={"lr": 0.1, "model": {"width": 2}},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="tracked",
            storage_path=str(tmp_path / "storage"),
            progress=False,
            callbacks=[
                MLflowLoggerCallback(mlflow_server, experiment_name="trainer"),
                TBXLoggerCallback(),
            ],
        ),
    ).fit()
    assert result.error is None
    (run,) = _runs(mlflow_server, "trainer")  # the driver's run, joined by setup_mlflow
    client = MlflowClient(mlflow_server)
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [1, 2, 3]
    assert [m["loss"] for m in result.metrics_history] == [
        m.value for m in sorted(history, key=lambda m: m.step)
    ]
    assert "phase" not in run.data.metrics  # strings are not metrics
    assert run.data.params == {"lr": "0.1", "model/width": "2"}
    assert run.info.status == "FINISHED"
    # Rank 0's setup_mlflow logged into the same run (MLFLOW_RUN_ID from the driver).
    assert len(client.get_metric_history(run.info.run_id, "from_setup_mlflow")) == 3
    # Every committed checkpoint's URI, and the latest.
    committed = CheckpointStorage(result.path).list_committed()
    tags = run.data.tags
    assert tags["torchjob.checkpoint"] == committed[-1].path
    assert {tags[f"torchjob.checkpoint.{c.index}"] for c in committed} == {
        c.path for c in committed
    }
    # TensorBoard: the run's directory holds the event files.
    assert [s for s, _ in _scalars(Path(result.path), "loss")] == [1, 2, 3]


def score_trial(config: dict[str, Any]) -> None:
    for i in range(3):
        tune.report(score=config["x"] * (i + 1), note="text")


def test_tune_run_with_mlflow_and_tensorboard_callbacks(mlflow_server: str, tmp_path: Path) -> None:
    analysis = tune.run(
        score_trial,
        config={"x": tune.grid_search([1, 2])},
        local_dir=str(tmp_path),
        name="study",
        verbose=0,
        callbacks=[
            MLflowLoggerCallback(mlflow_server, experiment_name="tune"),
            TBXLoggerCallback(),
        ],
    )
    assert len(analysis.trials) == 2
    client = MlflowClient(mlflow_server)
    runs = {r.data.params["x"]: r for r in _runs(mlflow_server, "tune")}
    assert set(runs) == {"1", "2"}
    for x, run in runs.items():
        assert run.info.status == "FINISHED"
        values = sorted(
            (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "score")
        )
        assert values == [(i + 1, float(int(x) * (i + 1))) for i in range(3)]
    for trial in analysis.trials:
        logdir = Path(trial.result.path)
        x = trial.config["x"]
        assert _scalars(logdir, "score") == [(i + 1, float(x * (i + 1))) for i in range(3)]


def test_an_unreachable_tracking_server_is_named_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = closed_port_uri()
    callback = MLflowLoggerCallback(bad, experiment_name="lost")
    with caplog.at_level(logging.ERROR, logger="torchjob.tracking"):
        analysis = tune.run(
            score_trial, config={"x": 3}, local_dir=str(tmp_path), verbose=0, callbacks=[callback]
        )
        stand_in = setup_mlflow({"x": 3}, tracking_uri=bad)
    (trial,) = analysis.trials
    assert trial.result.metrics["score"] == 9  # every report of the trial was kept
    assert callback.error is not None and bad in str(callback.error)
    assert bad in caplog.text and "training goes on without MLflow" in caplog.text
    assert not isinstance(stand_in, types.ModuleType) and stand_in.log_metric("x", 1) is None


def test_setup_mlflow_outside_rank_0_is_a_no_op() -> None:
    """Outside a training function the context is rank 0 of 1; rank_zero_only is a rank test."""
    from torchjob.train import _session

    session = _session.Session(
        world_rank=1,
        local_rank=1,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        generation=0,
        experiment_name="x",
        run_path="",
        device="cpu",
        storage_url=None,
        num_to_keep=None,
        score_attribute=None,
        score_order="max",
        checkpoint=None,
    )
    _session.set_current(session)
    try:
        stand_in = setup_mlflow({"a": 1}, tracking_uri=closed_port_uri())
    finally:
        _session.set_current(None)
    assert not stand_in and stand_in.log_param("a", 1) is None


def test_wandb_callback_offline_writes_a_run_per_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchjob.air.integrations.wandb import WandbLoggerCallback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    # W&B starts a service process at the first init; on a loaded 2-core CI machine that can
    # take longer than its 90 s default, which would fail the trial, not the feature.
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "600")
    monkeypatch.setenv("WANDB__SERVICE_WAIT", "600")
    analysis = tune.run(
        score_trial,
        config={"x": 2},
        local_dir=str(tmp_path),
        verbose=0,
        callbacks=[WandbLoggerCallback(project="tj", group="study")],
    )
    (trial,) = analysis.trials
    # Offline, W&B writes the run's records into one .wandb file for a later `wandb sync`.
    (records,) = Path(trial.result.path).glob("wandb/offline-run-*/run-*.wandb")
    # Its service process writes them: on a loaded machine the file may still hold only its
    # header for a moment after run.finish() returned (seen in CI).
    wait_for(
        lambda: b"score" in records.read_bytes() and b"study" in records.read_bytes(),
        120,
        lambda: f"the metric and the group in {records}: {records.read_bytes()[:200]!r}",
        interval=0.2,
    )
