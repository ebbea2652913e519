"""One hyperparameter as the study core sees it, its encoding for optuna, and the grid.

A :class:`Dimension` speaks the TorchTune API's vocabulary (``ParameterType``; ``high`` is
inclusive, for ``int`` too). The operator makes one from each ``spec.searchSpace[]``
(:meth:`Dimension.of`); the local API makes one from each ``tune.uniform``/... leaf of a
``param_space`` (``torchjob.search.domains``). Why not the pydantic ``Parameter`` itself: it
validates what the API server accepts (a name pattern, at most 1,000 values, JSON values,
``low < high``), and a local search takes more (any key, Python objects as choices,
``tune.randint(0, 1)``); a ``Dimension`` holds either without faking a validated model.

No optuna here: ``suggest`` asks a trial through its public methods, and
``torchjob.search.sampling.distribution`` is the same mapping as optuna distributions
(tests/unit/test_search_core.py checks the two agree).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchjob.api.torchtune import Parameter, ParameterType

PRIMITIVE = (type(None), bool, int, float, str)
"""What optuna stores as a categorical choice; other choices travel as their index."""

NUMERIC = (ParameterType.UNIFORM, ParameterType.LOGUNIFORM, ParameterType.INT)
CHOICES = (ParameterType.CATEGORICAL, ParameterType.GRID)


@dataclass(frozen=True)
class Dimension:
    """One hyperparameter: ``name`` is its key (``a/b`` nests), ``values`` its choices."""

    name: str
    type: ParameterType
    low: float | None = None
    high: float | None = None
    """Inclusive (``int`` too: ``low..high``)."""
    values: tuple[Any, ...] = ()

    @classmethod
    def of(cls, p: Parameter) -> Dimension:
        """A TorchTune's ``spec.searchSpace[]`` entry."""
        return cls(p.name, p.type, p.low, p.high, tuple(p.values or ()))

    def wire(self) -> dict[str, Any]:
        """As a TorchTune's ``spec.searchSpace[]`` entry (camelCase JSON)."""
        if self.type in NUMERIC:
            return {"name": self.name, "type": self.type.value, "low": self.low, "high": self.high}
        return {"name": self.name, "type": self.type.value, "values": list(self.values)}


def _primitive(dim: Dimension) -> bool:
    return all(isinstance(v, PRIMITIVE) for v in dim.values)


def choices(dim: Dimension) -> list[Any]:
    """The choices optuna sees: the values, or their indices when one is not a primitive."""
    values = list(dim.values)
    return values if _primitive(dim) else list(range(len(values)))


def encode(dim: Dimension, value: Any) -> Any:
    """A value as optuna stores it (the index of a non-primitive choice)."""
    if dim.type in CHOICES and not _primitive(dim):
        return dim.values.index(value)
    return value


def decode(dim: Dimension, value: Any) -> Any:
    """What optuna stored, as the value (the choice at a stored index)."""
    if dim.type in CHOICES and not _primitive(dim):
        return dim.values[int(value)]
    return value


def int_bounds(dim: Dimension) -> tuple[int, int]:
    """An ``int`` dimension's inclusive integer bounds."""
    return math.ceil(dim.low or 0), math.floor(dim.high or 0)


def suggest(trial: Any, dim: Dimension) -> Any:
    """The value an optuna trial suggests for ``dim`` (decoded)."""
    if dim.type is ParameterType.UNIFORM:
        return trial.suggest_float(dim.name, float(dim.low or 0.0), float(dim.high or 0.0))
    if dim.type is ParameterType.LOGUNIFORM:
        return trial.suggest_float(
            dim.name, float(dim.low or 0.0), float(dim.high or 0.0), log=True
        )
    if dim.type is ParameterType.INT:
        low, high = int_bounds(dim)
        return trial.suggest_int(dim.name, low, high)
    return decode(dim, trial.suggest_categorical(dim.name, choices(dim)))


def grid_points(dims: Sequence[Dimension]) -> list[dict[str, Any]]:
    """Every combination of the dimensions' values, first dimension slowest (``[{}]`` for
    none). The operator's grid sampler passes every parameter (grid and categorical); the
    local Tuner passes only its ``grid_search`` leaves (it samples ``choice``)."""
    points: list[dict[str, Any]] = [{}]
    for d in dims:
        points = [{**point, d.name: v} for point in points for v in d.values]
    return points


def grid_size(dims: Sequence[Dimension]) -> int:
    """``len(grid_points(dims))``, without listing them."""
    return math.prod(len(d.values) for d in dims)


__all__ = [
    "CHOICES",
    "NUMERIC",
    "PRIMITIVE",
    "Dimension",
    "choices",
    "decode",
    "encode",
    "grid_points",
    "grid_size",
    "int_bounds",
    "suggest",
]
