"""How to search, by name: the sampler and pruner names each backend takes, and the pruner
settings a name stands for. No optuna (``torchjob.search.sampling`` builds the objects).

The two backends take different names, and "median" means a different warm-up in each;
both are kept as they were:

- the local ``Tuner``: ``search_alg`` ``"optuna"`` (TPE) or ``"random"``; ``pruner`` ``None``
  or ``"median"`` (startup 1 trial, warm-up **1** step); or optuna objects.
- a TorchTune (``TuneConfig(backend="cluster")``, the operator): ``search_alg`` one of
  :data:`SAMPLER_NAMES`; ``pruner`` one of :data:`PRUNER_NAMES` (its ``spec.pruner``
  defaults: median with startup 1, warm-up **0**) or ``spec.pruner`` as a dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from torchjob.api.torchtune import Pruner, PrunerType, SamplerType

SAMPLER_NAMES: Final[Mapping[str, SamplerType]] = {
    "optuna": SamplerType.TPE,
    "tpe": SamplerType.TPE,
    "random": SamplerType.RANDOM,
    "grid": SamplerType.GRID,
    "cmaes": SamplerType.CMAES,
}
"""A TorchTune's ``spec.sampler.type`` by the name ``TuneConfig.search_alg`` gives it."""

LOCAL_SAMPLER_NAMES: Final[Mapping[str, SamplerType]] = {
    "optuna": SamplerType.TPE,
    "random": SamplerType.RANDOM,
}
"""The names the local ``Tuner`` takes (any other sampler: pass the optuna object)."""

PRUNER_NAMES: Final[Mapping[str | None, PrunerType]] = {
    None: PrunerType.NONE,
    "none": PrunerType.NONE,
    "median": PrunerType.MEDIAN,
    "asha": PrunerType.SUCCESSIVE_HALVING,
    "successive_halving": PrunerType.SUCCESSIVE_HALVING,
    "hyperband": PrunerType.HYPERBAND,
}
"""A TorchTune's ``spec.pruner.type`` by the name ``TuneConfig.pruner`` gives it."""

LOCAL_PRUNERS: Final[Mapping[str | None, Pruner]] = {
    None: Pruner(type=PrunerType.NONE),
    "median": Pruner(type=PrunerType.MEDIAN, startup_trials=1, warmup_steps=1),
}
"""The pruner settings of the names the local ``Tuner`` takes."""


def named(table: Mapping[Any, Any], name: Any) -> bool:
    """``name`` is a key of ``table`` (``None`` or a string; a dict or an object is not)."""
    return (name is None or isinstance(name, str)) and name in table


__all__ = [
    "LOCAL_PRUNERS",
    "LOCAL_SAMPLER_NAMES",
    "PRUNER_NAMES",
    "SAMPLER_NAMES",
    "named",
]
