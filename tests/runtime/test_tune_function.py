"""Tuner mechanics with in-driver function trainables (fast): optuna search, stop, errors, space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchjob import tune


def quadratic(config: dict[str, Any]) -> None:
    x = config["x"]
    tune.report(score=(x - 3.0) ** 2 + (0 if config["mode"] == "good" else 5.0))


def test_optuna_tpe_beats_its_own_random_start(tmp_path: Path) -> None:
    tuner = tune.Tuner(
        quadratic,
        param_space={"x": tune.uniform(-10, 10), "mode": tune.choice(["good", "bad"])},
        tune_config=tune.TuneConfig(metric="score", mode="min", num_samples=40, seed=0),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    grid = tuner.fit()
    best = grid.get_best_result()
    assert best.config["mode"] == "good"
    assert abs(best.config["x"] - 3.0) < 1.0
    # TPE concentrates its later samples near the optimum.
    late = [abs(r.config["x"] - 3.0) for r in list(grid)[20:]]
    early = [abs(r.config["x"] - 3.0) for r in list(grid)[:10]]
    assert sorted(late)[len(late) // 2] < sorted(early)[len(early) // 2]


def counting(config: dict[str, Any]) -> None:
    for i in range(100):
        tune.report(i=i, acc=i / 10)


def test_stop_criteria_end_a_trial_normally(tmp_path: Path) -> None:
    grid = tune.Tuner(
        counting,
        tune_config=tune.TuneConfig(num_samples=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"acc": 0.5}),
    ).fit()
    (result,) = list(grid)
    assert result.status == "TERMINATED"
    assert result.metrics["acc"] == 0.5 and result.metrics["training_iteration"] == 6


def flaky(config: dict[str, Any]) -> dict[str, Any]:
    if config["fail"]:
        raise ValueError("boom")
    return {"loss": 1.0}


def test_a_failing_trial_is_recorded_not_raised(tmp_path: Path) -> None:
    grid = tune.Tuner(
        flaky,
        param_space={"fail": tune.grid_search([True, False])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", search_alg="random"),
        run_config=tune.RunConfig(storage_path=str(tmp_path)),
    ).fit()
    assert grid.num_errors == 1 and "boom" in str(grid.errors[0])
    assert grid.get_best_result().config["fail"] is False


def test_grid_is_crossed_and_repeated_num_samples_times(tmp_path: Path) -> None:
    seen: list[tuple[Any, ...]] = []

    def record(config: dict[str, Any]) -> dict[str, Any]:
        seen.append((config["a"], config["nested"]["b"], config["nested"]["n"], config["fixed"]))
        return {"v": 0.0}

    tune.Tuner(
        record,
        param_space={
            "a": tune.grid_search([1, 2]),
            "nested": {"b": tune.grid_search(["x", "y", "z"]), "n": tune.randint(0, 3)},
            "fixed": "k",
        },
        tune_config=tune.TuneConfig(num_samples=2, search_alg="random", seed=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path)),
    ).fit()
    assert len(seen) == 2 * 3 * 2
    assert sorted({(a, b) for a, b, _, _ in seen}) == [(a, b) for a in (1, 2) for b in "xyz"]
    assert all(0 <= n < 3 and fixed == "k" for _, _, n, fixed in seen)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda: tune.uniform(1, 1), "low must be < high", id="uniform"),
        pytest.param(lambda: tune.loguniform(0, 1), "0 < low", id="loguniform"),
        pytest.param(lambda: tune.choice([]), "at least one", id="choice"),
        pytest.param(
            lambda: tune.Tuner(quadratic, tune_config=tune.TuneConfig(metric="x")),
            "go together",
            id="metric-without-mode",
        ),
        pytest.param(lambda: tune.Tuner(tune.Trainable), "stop criterion", id="class-without-stop"),
    ],
)
def test_bad_search_definitions(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_report_outside_a_trial() -> None:
    with pytest.raises(RuntimeError, match="outside a Tuner trial"):
        tune.report(loss=1.0)
