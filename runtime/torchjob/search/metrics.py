"""The objective metric: which reported key it is, and which value is better.

``validation_loss`` was RaySGD's name for the validation loss in the seeds' era (seed 000's
Tune example asks ``get_best_config(metric="validation_loss")``); ``PyTorchTrainer`` reports
``val_loss``. Either name finds the other, in ``tune.run``, the ``Tuner`` and a TorchTune,
when the name asked for was not reported itself; a metric reported under neither name is
still unknown (the callers say so, naming what was reported).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, Final

METRIC_ALIASES: Final[Mapping[str, str]] = {
    "validation_loss": "val_loss",
    "val_loss": "validation_loss",
}


def metric_key(metric: str, reported: Collection[str]) -> str:
    """The key ``metric`` was reported under: itself, else its alias if that was reported,
    else ``metric`` (not reported: the caller decides what that means)."""
    if metric in reported:
        return metric
    alias = METRIC_ALIASES.get(metric)
    return alias if alias is not None and alias in reported else metric


def metric_value(metrics: Mapping[str, Any], metric: str) -> Any:
    """The value of ``metric`` (or of its alias) in one report; ``None`` when absent."""
    return metrics.get(metric_key(metric, metrics.keys()))


def is_better(value: float, best: float | None, mode: str) -> bool:
    """``value`` beats ``best`` (``None``: nothing yet) for ``mode`` ``"min"``/``"max"``;
    NaN never does."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value < best if mode == "min" else value > best


__all__ = ["METRIC_ALIASES", "is_better", "metric_key", "metric_value"]
