"""The Python side of a TorchTune: a Tuner param_space becomes a valid TorchTune, a status
becomes a ResultGrid, and asking for a metric no trial reported is an error that lists them."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob import tune
from torchjob.api.torchtune import TorchTune
from torchjob.tune.cluster import result_grid, study_manifest
from torchjob.tune.result import ExperimentAnalysis, Result, ResultGrid

TEMPLATE: dict[str, Any] = {
    "apiVersion": "torchjob.io/v1alpha1",
    "kind": "TorchJob",
    "metadata": {"name": "trial", "labels": {"team": "a"}},
    "spec": {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "trainer", "image": "t:1"}]}},
    },
}


def test_a_param_space_becomes_a_valid_torchtune() -> None:
    body = study_manifest(
        "lr-search",
        {
            "train": {"lr": tune.loguniform(1e-4, 1e-1), "layers": tune.randint(1, 5)},
            "opt": tune.choice(["sgd", "adam"]),
        },
        metric="loss",
        mode="min",
        template=TEMPLATE,
        num_samples=8,
        pruner="median",
        max_concurrent_trials=2,
        seed=3,
    )
    tt = TorchTune.model_validate(body)
    assert [(p.name, p.type.value) for p in tt.spec.search_space] == [
        ("train/lr", "loguniform"),
        ("train/layers", "int"),
        ("opt", "categorical"),
    ]
    layers = tt.spec.search_space[1]
    assert (layers.low, layers.high) == (1, 4)  # randint's high is exclusive, int's inclusive
    assert tt.spec.max_trials == 8 and tt.spec.parallelism == 2
    assert tt.spec.sampler.type.value == "tpe" and tt.spec.sampler.seed == 3
    assert tt.spec.pruner.type.value == "median"
    assert body["spec"]["trialTemplate"]["metadata"] == {"labels": {"team": "a"}}


def test_a_grid_uses_the_grid_sampler_and_counts_its_points() -> None:
    body = study_manifest(
        "g",
        {"x": tune.grid_search([1, 2, 3]), "y": tune.choice(["a", "b"])},
        metric="loss",
        mode="min",
        template=TEMPLATE,
        num_samples=2,
    )
    TorchTune.model_validate(body)
    assert body["spec"]["sampler"] == {"type": "grid"}
    assert body["spec"]["maxTrials"] == 12


def test_an_unknown_pruner_name_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="pruner: a TorchTune takes one of"):
        study_manifest(
            "c", {"x": tune.uniform(0, 1)}, metric="loss", mode="min", template=TEMPLATE, pruner="x"
        )


def test_a_status_reads_back_as_a_result_grid() -> None:
    obj = {
        "spec": {"objective": {"metric": "loss", "mode": "min"}},
        "status": {
            "trials": [
                {
                    "number": 1,
                    "name": "s-t1",
                    "params": {"a/x": 2},
                    "state": "Pruned",
                    "intermediate": {"1": 5.0},
                },
                {
                    "number": 0,
                    "name": "s-t0",
                    "params": {"a/x": 1},
                    "state": "Succeeded",
                    "intermediate": {"1": 1.0, "3": 0.5},
                    "checkpoint": "/ck/s-t0/3",
                },
                {
                    "number": 2,
                    "name": "s-t2",
                    "params": {"a/x": 3},
                    "state": "Failed",
                    "message": "OOM",
                },
            ]
        },
    }
    grid = result_grid(obj)
    assert [r.status for r in grid] == ["TERMINATED", "PRUNED", "ERROR"]
    best = grid.get_best_result()
    assert best.config == {"a": {"x": 1}} and best.metrics["loss"] == 0.5
    assert best.checkpoint is not None and best.checkpoint.path == "/ck/s-t0/3"
    assert best.metrics_history == [
        {"loss": 1.0, "training_iteration": 1},
        {"loss": 0.5, "training_iteration": 3},
    ]
    assert "OOM" in str(grid[2].error)


def test_get_best_config_with_an_unreported_metric_lists_the_reported_ones() -> None:
    grid = ResultGrid(
        [
            Result(
                trial_id="0",
                config={"x": 1},
                metrics={"acc": 0.9, "epoch": 2},
                metrics_history=[{"acc": 0.9, "epoch": 2}],
            )
        ],
        "acc",
        "max",
    )
    analysis = ExperimentAnalysis(grid, "acc", "max")
    assert analysis.get_best_config() == {"x": 1}
    with pytest.raises(
        ValueError, match=r"no trial reported the metric 'loss'; the trials reported: acc, epoch"
    ):
        analysis.get_best_config(metric="loss", mode="min")


def test_cli_tune_submit_rejects_a_bad_study_before_sending(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from torchjob.cli.main import EXIT_USAGE, main

    body = study_manifest(
        "bad", {"x": tune.uniform(0, 1)}, metric="loss", mode="min", template=TEMPLATE
    )
    body["spec"]["searchSpace"] = []
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(body))
    assert main(["tune", "submit", "-f", str(path), "--kubeconfig", "/nonexistent"]) == EXIT_USAGE
    assert "spec.searchSpace must list at least one parameter" in capsys.readouterr().err
