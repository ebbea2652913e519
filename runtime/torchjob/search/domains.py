"""The local search-space API (``tune.uniform``, ``loguniform``, ``randint``, ``choice``,
``grid_search``) and ``param_space`` trees, as dimensions of the study core.

A param space is a (nested) dict whose leaves are constants or these objects. Each leaf's
name is its path joined by ``/`` (``train_loop_config/lr``); each object is one
:class:`~torchjob.search.space.Dimension` under that name. :func:`grid` expands the
``grid_search`` leaves into their cartesian product; :func:`resolve` fills the other
domains for one trial by asking an optuna trial (so TPE and the random sampler see named,
typed parameters).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchjob.api.torchtune import ParameterType
from torchjob.search import space
from torchjob.search.space import Dimension


class Domain:
    """A distribution of values for one hyperparameter (sampled, not enumerated)."""

    def dimension(self, name: str) -> Dimension:
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(Domain):
    low: float
    high: float

    def dimension(self, name: str) -> Dimension:
        return Dimension(name, ParameterType.UNIFORM, self.low, self.high)


@dataclass(frozen=True)
class LogUniform(Domain):
    low: float
    high: float

    def dimension(self, name: str) -> Dimension:
        return Dimension(name, ParameterType.LOGUNIFORM, self.low, self.high)


@dataclass(frozen=True)
class RandInt(Domain):
    low: int
    high: int
    """Exclusive, as in Ray Tune and ``random.randrange`` (a dimension's is inclusive)."""

    def dimension(self, name: str) -> Dimension:
        return Dimension(name, ParameterType.INT, self.low, self.high - 1)


@dataclass(frozen=True)
class Choice(Domain):
    categories: tuple[Any, ...]

    def dimension(self, name: str) -> Dimension:
        return Dimension(name, ParameterType.CATEGORICAL, values=self.categories)


@dataclass(frozen=True)
class GridSearch:
    """Every value is tried (times ``num_samples``); not sampled."""

    values: tuple[Any, ...]

    def dimension(self, name: str) -> Dimension:
        return Dimension(name, ParameterType.GRID, values=self.values)


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


def leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of every leaf, depth first, in the dicts' order."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from leaves(value, f"{path}/")
        else:
            yield path, value


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split("/")
    node = config
    for p in parents:
        node = node[p]
    node[last] = value


def _copy(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def grid(param_space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One partial assignment (path -> value) per point of the ``grid_search`` leaves'
    grid (``[{}]`` when there is none)."""
    return space.grid_points(
        [leaf.dimension(path) for path, leaf in leaves(param_space) if isinstance(leaf, GridSearch)]
    )


def resolve(
    param_space: Mapping[str, Any], grid_point: Mapping[str, Any], trial: Any
) -> dict[str, Any]:
    """A concrete config: grid values from ``grid_point``, domains suggested by ``trial``."""
    config = _copy(param_space)
    for path, leaf in leaves(param_space):
        if isinstance(leaf, GridSearch):
            _set(config, path, grid_point[path])
        elif isinstance(leaf, Domain):
            _set(config, path, space.suggest(trial, leaf.dimension(path)))
    return config


def flatten(config: Mapping[str, Any], prefix: str = "config/") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"config/a/b": 1}``: the columns of a results dataframe."""
    return {f"{prefix}{path}": value for path, value in leaves(config)}


__all__ = [
    "Choice",
    "Domain",
    "GridSearch",
    "LogUniform",
    "RandInt",
    "Uniform",
    "choice",
    "flatten",
    "grid",
    "grid_search",
    "leaves",
    "loguniform",
    "randint",
    "resolve",
    "uniform",
]
