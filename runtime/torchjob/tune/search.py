"""Search-space helpers (``tune.uniform``, ``loguniform``, ``choice``, ``randint``, ``grid_search``).

A param space is a (nested) dict whose leaves are constants or :class:`Domain`
objects. :func:`grid_points` expands ``grid_search`` leaves into their cartesian
product; :func:`resolve` fills the other domains for one trial by asking an
optuna trial (so TPE and the random sampler see named, typed parameters).
Parameter names are the leaf's path joined by ``/`` (``train_loop_config/lr``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Domain:
    """A distribution of values for one hyperparameter."""

    def suggest(self, trial: Any, name: str) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(Domain):
    low: float
    high: float

    def suggest(self, trial: Any, name: str) -> Any:
        return trial.suggest_float(name, self.low, self.high)


@dataclass(frozen=True)
class LogUniform(Domain):
    low: float
    high: float

    def suggest(self, trial: Any, name: str) -> Any:
        return trial.suggest_float(name, self.low, self.high, log=True)


@dataclass(frozen=True)
class RandInt(Domain):
    low: int
    high: int
    """Exclusive, as in Ray Tune and ``random.randrange``."""

    def suggest(self, trial: Any, name: str) -> Any:
        return trial.suggest_int(name, self.low, self.high - 1)


_PRIMITIVE = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Choice(Domain):
    categories: tuple[Any, ...]

    def suggest(self, trial: Any, name: str) -> Any:
        if all(isinstance(c, _PRIMITIVE) for c in self.categories):
            return trial.suggest_categorical(name, list(self.categories))
        # optuna stores only primitives: choose an index, return the object.
        index = trial.suggest_categorical(name, list(range(len(self.categories))))
        return self.categories[index]


@dataclass(frozen=True)
class GridSearch:
    """Every value is tried (times ``num_samples``); not sampled."""

    values: tuple[Any, ...]


def uniform(low: float, high: float) -> Uniform:
    if not low < high:
        raise ValueError(f"uniform: low must be < high, got {low}, {high}")
    return Uniform(float(low), float(high))


def loguniform(low: float, high: float) -> LogUniform:
    if not 0 < low < high:
        raise ValueError(f"loguniform: need 0 < low < high, got {low}, {high}")
    return LogUniform(float(low), float(high))


def randint(low: int, high: int) -> RandInt:
    if not low < high:
        raise ValueError(f"randint: low must be < high (high is exclusive), got {low}, {high}")
    return RandInt(int(low), int(high))


def choice(categories: Sequence[Any]) -> Choice:
    if len(categories) == 0:
        raise ValueError("choice: needs at least one category")
    return Choice(tuple(categories))


def grid_search(values: Sequence[Any]) -> GridSearch:
    if len(values) == 0:
        raise ValueError("grid_search: needs at least one value")
    return GridSearch(tuple(values))


def _leaves(space: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in space.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{path}/")
        else:
            yield path, value


def _set(space: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split("/")
    node = space
    for p in parents:
        node = node[p]
    node[last] = value


def _copy(space: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in space.items()}


def grid_points(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One partial assignment per point of the grid (``[{}]`` when there is no grid)."""
    grids = [(path, leaf.values) for path, leaf in _leaves(space) if isinstance(leaf, GridSearch)]
    if not grids:
        return [{}]
    paths = [p for p, _ in grids]
    return [
        dict(zip(paths, combo, strict=True)) for combo in itertools.product(*(v for _, v in grids))
    ]


def resolve(space: Mapping[str, Any], grid_point: Mapping[str, Any], trial: Any) -> dict[str, Any]:
    """A concrete config: grid values from ``grid_point``, domains suggested by ``trial``."""
    config = _copy(space)
    for path, leaf in _leaves(space):
        if isinstance(leaf, GridSearch):
            _set(config, path, grid_point[path])
        elif isinstance(leaf, Domain):
            _set(config, path, leaf.suggest(trial, path))
    return config


def flatten(config: Mapping[str, Any], prefix: str = "config/") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"config/a/b": 1}``: the columns of a results dataframe."""
    return {f"{prefix}{path}": value for path, value in _leaves(config)}


def is_better(value: float, best: float | None, mode: str) -> bool:
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value < best if mode == "min" else value > best
