"""The study core (torchjob.search): one search space, encoding, grid, sampler and pruner for
the local Tuner and the operator, and the objective metric's alias (issue 29, item 6):
``validation_loss`` finds ``val_loss`` and back, in ``tune.run``, the ``Tuner`` and a
TorchTune, while a metric reported under neither name is still an error."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import pytest
from tests.unit.builders import torchtune

from torchjob import tune
from torchjob.api.torchtune import Parameter, ParameterType, Pruner, PrunerType, SamplerType
from torchjob.search import domains, sampling, strategy
from torchjob.search.metrics import metric_key, metric_value
from torchjob.search.space import Dimension, decode, encode, grid_points, grid_size, suggest
from torchjob.tune.result import ExperimentAnalysis, Result, ResultGrid
from torchjob_operator.torchtune.plan import plan_study

DIMS = [
    Dimension("u", ParameterType.UNIFORM, -1.0, 1.0),
    Dimension("l", ParameterType.LOGUNIFORM, 1e-4, 1e-1),
    Dimension("i", ParameterType.INT, 0.5, 4.5),
    Dimension("c", ParameterType.CATEGORICAL, values=("a", 1, None)),
    Dimension("o", ParameterType.CATEGORICAL, values=({"k": 1}, [2])),
]


def test_suggest_asks_exactly_the_distribution_of_each_dimension() -> None:
    study = sampling.new_study(
        "min", sampling.make_sampler(SamplerType.RANDOM, seed=0), optuna.pruners.NopPruner()
    )
    for _ in range(5):
        trial = study.ask()
        values = {d.name: suggest(trial, d) for d in DIMS}
        assert trial.distributions == {d.name: sampling.distribution(d) for d in DIMS}
        assert values["o"] in DIMS[4].values and 1 <= values["i"] <= 4
        study.tell(trial, 0.0)


def test_a_non_primitive_choice_travels_as_its_index() -> None:
    o = DIMS[4]
    assert encode(o, [2]) == 1 and decode(o, 1) == [2]
    assert encode(DIMS[3], None) is None and decode(DIMS[3], "a") == "a"


def test_the_grid_lists_every_point_first_dimension_slowest() -> None:
    dims = [Dimension("a", ParameterType.GRID, values=(1, 2)), DIMS[3]]
    assert grid_points(dims) == [
        {"a": 1, "c": "a"},
        {"a": 1, "c": 1},
        {"a": 1, "c": None},
        {"a": 2, "c": "a"},
        {"a": 2, "c": 1},
        {"a": 2, "c": None},
    ]
    assert grid_size(dims) == 6 and grid_points([]) == [{}]


def test_the_local_api_and_a_torchtune_parameter_are_the_same_dimension() -> None:
    assert domains.randint(1, 9).dimension("n") == Dimension.of(
        Parameter(name="n", type=ParameterType.INT, low=1, high=8)
    )
    assert domains.choice(["x", "y"]).dimension("c") == Dimension.of(
        Parameter(name="c", type=ParameterType.CATEGORICAL, values=["x", "y"])
    )
    # The local grid enumerates grid_search leaves only (choice is sampled).
    space = {"a": {"g": domains.grid_search([1, 2])}, "c": domains.choice([3, 4]), "k": 5}
    assert domains.grid(space) == [{"a/g": 1}, {"a/g": 2}]


def test_median_keeps_each_backends_warm_up() -> None:
    local = sampling.make_pruner(strategy.LOCAL_PRUNERS["median"])
    cluster = sampling.make_pruner(Pruner(type=strategy.PRUNER_NAMES["median"]))
    assert isinstance(local, optuna.pruners.MedianPruner)
    assert (local._n_startup_trials, local._n_warmup_steps) == (1, 1)
    assert (cluster._n_startup_trials, cluster._n_warmup_steps) == (1, 0)
    assert strategy.PRUNER_NAMES["asha"] is PrunerType.SUCCESSIVE_HALVING
    assert not strategy.named(strategy.LOCAL_SAMPLER_NAMES, "tpe")  # local: 'optuna'
    assert strategy.SAMPLER_NAMES["optuna"] is SamplerType.TPE


# --- item 6: validation_loss and val_loss ------------------------------------------------


def test_the_alias_resolves_only_to_a_reported_name() -> None:
    assert metric_key("validation_loss", {"val_loss": 1}) == "val_loss"
    assert metric_key("val_loss", {"validation_loss": 1}) == "validation_loss"
    assert metric_key("val_loss", {"val_loss": 1, "validation_loss": 2}) == "val_loss"
    assert metric_key("validation_loss", {"loss": 1}) == "validation_loss"
    assert metric_value({"val_loss": 0.5}, "validation_loss") == 0.5
    assert metric_value({"loss": 0.5}, "validation_loss") is None


def _analysis(metric: str | None = None) -> ExperimentAnalysis:
    results = [
        Result(
            trial_id=f"{i:05d}",
            config={"lr": lr},
            metrics={"val_loss": v, "epoch": 2},
            metrics_history=[{"val_loss": v, "epoch": 2}],
        )
        for i, (lr, v) in enumerate([(0.1, 0.3), (0.01, 0.2)])
    ]
    return ExperimentAnalysis(ResultGrid(results, metric, "min"), metric, "min")


def test_get_best_config_takes_validation_loss_for_val_loss() -> None:
    analysis = _analysis()
    assert analysis.get_best_config(metric="validation_loss", mode="min") == {"lr": 0.01}
    assert analysis.get_best_config(metric="val_loss", mode="min") == {"lr": 0.01}
    assert analysis.result_grid.get_best_result("validation_loss", "min").config == {"lr": 0.01}
    frame = analysis.dataframe(metric="validation_loss", mode="min")
    assert list(frame["val_loss"]) == [0.3, 0.2]


def test_an_unknown_metric_is_still_an_error_naming_the_reported_ones() -> None:
    analysis = _analysis()
    with pytest.raises(
        ValueError,
        match=r"no trial reported the metric 'validation_los'; the trials reported: "
        r"epoch, val_loss",
    ):
        analysis.get_best_config(metric="validation_los", mode="min")
    with pytest.raises(ValueError, match=r"no trial reported the metric 'validation_accuracy'"):
        analysis.get_best_config(metric="validation_accuracy", mode="max")
    with pytest.raises(RuntimeError, match="no trial reported 'loss'"):
        analysis.result_grid.get_best_result("loss", "min")


def _reports_val_loss(config: dict[str, Any]) -> None:
    for step in range(3):
        tune.report(val_loss=(config["x"] - 1.0) ** 2 + 1.0 / (step + 1))


@pytest.mark.parametrize("via", ["tuner", "run"])
def test_a_local_search_optimizes_validation_loss_reported_as_val_loss(
    tmp_path: Path, via: str
) -> None:
    space = {"x": tune.grid_search([0.0, 1.0, 3.0])}
    if via == "tuner":
        grid = tune.Tuner(
            _reports_val_loss,
            param_space=space,
            tune_config=tune.TuneConfig(metric="validation_loss", mode="min", pruner="median"),
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()
        assert grid.get_best_result().config == {"x": 1.0}
    else:
        analysis = tune.run(
            _reports_val_loss,
            config=space,
            metric="validation_loss",
            mode="min",
            local_dir=str(tmp_path),
            verbose=0,
        )
        assert analysis.best_config == {"x": 1.0}
        with pytest.raises(ValueError, match="no trial reported the metric 'vall_loss'"):
            analysis.get_best_config(metric="vall_loss", mode="min")


def _study(metric: str) -> dict[str, Any]:
    space = [{"name": "x", "type": "grid", "values": [1.0]}]
    meta = {"name": "s", "namespace": "ns", "uid": "u", "generation": 1}
    tt = torchtune(
        space, meta, sampler={"type": "grid"}, objective={"metric": metric, "mode": "min"}
    )
    return tt


@pytest.mark.parametrize(
    ("metric", "state"), [("validation_loss", "Succeeded"), ("vloss", "Failed")]
)
def test_a_torchtune_takes_the_alias_and_fails_an_unknown_metric(metric: str, state: str) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    tt = _study(metric)
    tt["status"] = plan_study(tt, {}, now).status
    done = {
        "metadata": {},
        "spec": {},
        "status": {"phase": "Succeeded", "progress": {"step": 2, "metrics": {"val_loss": 0.25}}},
    }
    trial = plan_study(tt, {"s-t0": done}, now).status["trials"][0]
    assert trial["state"] == state
    if state == "Failed":
        assert "objective metric 'vloss'; it reported: val_loss" in trial["message"]
    else:
        assert trial["value"] == 0.25
