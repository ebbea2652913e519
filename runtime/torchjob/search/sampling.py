"""optuna for both backends: each dimension's distribution, the sampler, the pruner and the
study (the one module of the core that imports optuna; ~15 MiB, so its callers import it
when a search starts).
"""

from __future__ import annotations

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from torchjob.api.torchtune import Mode, ParameterType, Pruner, PrunerType, SamplerType
from torchjob.search.space import Dimension, choices, int_bounds

optuna.logging.set_verbosity(optuna.logging.WARNING)


def distribution(dim: Dimension) -> BaseDistribution:
    """The optuna distribution of ``dim`` (what :func:`torchjob.search.space.suggest` asks)."""
    if dim.type is ParameterType.UNIFORM:
        return FloatDistribution(float(dim.low or 0.0), float(dim.high or 0.0))
    if dim.type is ParameterType.LOGUNIFORM:
        return FloatDistribution(float(dim.low or 0.0), float(dim.high or 0.0), log=True)
    if dim.type is ParameterType.INT:
        return IntDistribution(*int_bounds(dim))
    return CategoricalDistribution(choices(dim))


def make_sampler(
    kind: SamplerType, *, seed: int | None = None, startup_trials: int | None = None
) -> optuna.samplers.BaseSampler:
    """The sampler of ``kind``: TPE (also for ``grid``, whose points are listed, not
    sampled) starts with 10 random trials, CMA-ES with 1, unless ``startup_trials``."""
    if kind is SamplerType.RANDOM:
        return optuna.samplers.RandomSampler(seed=seed)
    if kind is SamplerType.CMAES:
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            n_startup_trials=1 if startup_trials is None else startup_trials,
            warn_independent_sampling=False,
        )
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=10 if startup_trials is None else startup_trials
    )


def make_pruner(p: Pruner) -> optuna.pruners.BasePruner:
    """The pruner a TorchTune's ``spec.pruner`` (or a local name's settings) describes."""
    if p.type is PrunerType.MEDIAN:
        return optuna.pruners.MedianPruner(
            n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_steps
        )
    if p.type is PrunerType.SUCCESSIVE_HALVING:
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p.min_resource, reduction_factor=p.reduction_factor
        )
    if p.type is PrunerType.HYPERBAND:
        return optuna.pruners.HyperbandPruner(
            min_resource=p.min_resource,
            max_resource="auto" if p.max_resource is None else p.max_resource,
            reduction_factor=p.reduction_factor,
        )
    if p.type is PrunerType.THRESHOLD:
        return optuna.pruners.ThresholdPruner(lower=p.lower, upper=p.upper)
    return optuna.pruners.NopPruner()


def new_study(
    mode: Mode | str | None,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    *,
    name: str | None = None,
) -> optuna.Study:
    """An in-memory optuna study: maximize for ``"max"``, else minimize."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    maximize = mode is not None and Mode(mode) is Mode.MAX
    return optuna.create_study(
        study_name=name,
        direction=(
            optuna.study.StudyDirection.MAXIMIZE
            if maximize
            else optuna.study.StudyDirection.MINIMIZE
        ),
        sampler=sampler,
        pruner=pruner,
        storage=optuna.storages.InMemoryStorage(),
    )


__all__ = ["distribution", "make_pruner", "make_sampler", "new_study"]
