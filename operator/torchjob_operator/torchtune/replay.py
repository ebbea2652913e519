"""A TorchTune's optuna study, replayed from ``status.trials`` on every reconcile: the
sampler asks for the next trial's parameters with every recorded trial in its history, and
the pruner judges the running ones. The search space, its encoding, the grid, the sampler
and the pruner are the study core's (``torchjob.search``), as for the local ``Tuner``.
"""

from __future__ import annotations

from typing import Any

import optuna

from torchjob.api.torchtune import (
    PrunerType,
    SamplerType,
    TorchTuneSpec,
    TrialRecord,
    TrialState,
)
from torchjob.search.sampling import distribution, make_pruner, make_sampler, new_study
from torchjob.search.space import Dimension, decode, encode, grid_points, grid_size

DEFAULT_MAX_TRIALS = 10


def dimensions(spec: TorchTuneSpec) -> list[Dimension]:
    return [Dimension.of(p) for p in spec.search_space]


def max_trials(spec: TorchTuneSpec) -> int:
    if spec.max_trials is not None:
        return int(spec.max_trials)
    if spec.sampler.type is SamplerType.GRID:
        return grid_size(dimensions(spec))
    return DEFAULT_MAX_TRIALS


def _sampler(spec: TorchTuneSpec, number: int) -> optuna.samplers.BaseSampler:
    """Trial ``number`` samples with seed + number."""
    seed = None if spec.sampler.seed is None else spec.sampler.seed + number
    return make_sampler(spec.sampler.type, seed=seed, startup_trials=spec.sampler.startup_trials)


_OPTUNA_STATE = {
    TrialState.PENDING: optuna.trial.TrialState.RUNNING,
    TrialState.RUNNING: optuna.trial.TrialState.RUNNING,
    TrialState.SUCCEEDED: optuna.trial.TrialState.COMPLETE,
    TrialState.PRUNED: optuna.trial.TrialState.PRUNED,
    TrialState.FAILED: optuna.trial.TrialState.FAIL,
}


def optuna_study(
    name: str, spec: TorchTuneSpec, records: list[TrialRecord], *, sampler_for: int = 0
) -> tuple[optuna.Study, dict[int, int]]:
    """An in-memory optuna study holding ``records``; returns it and record number -> optuna
    trial id (for the pruner's writes)."""
    study = new_study(
        spec.objective.mode, _sampler(spec, sampler_for), make_pruner(spec.pruner), name=name
    )
    by_name = {d.name: d for d in dimensions(spec)}
    ids: dict[int, int] = {}
    for r in sorted(records, key=lambda r: r.number):
        state = _OPTUNA_STATE[r.state]
        if state is optuna.trial.TrialState.COMPLETE and r.value is None:
            state = optuna.trial.TrialState.FAIL
        params = {k: encode(by_name[k], v) for k, v in r.params.items() if k in by_name}
        trial = optuna.trial.create_trial(
            state=state,
            value=r.value if state is optuna.trial.TrialState.COMPLETE else None,
            params=params,
            distributions={k: distribution(by_name[k]) for k in params},
            system_attrs=dict(r.system_attrs or {}),
            intermediate_values={int(s): v for s, v in (r.intermediate or {}).items()},
        )
        if state is optuna.trial.TrialState.RUNNING:
            trial.datetime_complete = None
        study.add_trial(trial)
        ids[r.number] = study.get_trials(deepcopy=False)[-1]._trial_id
    return study, ids


def sample_params(spec: TorchTuneSpec, study: optuna.Study | None, number: int) -> dict[str, Any]:
    """The parameters of trial ``number``: the grid's next point, or optuna's sampler (seeded
    with seed + number) asked with every recorded trial, running ones too, in its history.
    The asked trial stays in ``study`` as running, so the next ask sees it."""
    dims = dimensions(spec)
    if spec.sampler.type is SamplerType.GRID or study is None:
        points = grid_points(dims)
        return dict(points[number % len(points)])
    study.sampler = _sampler(spec, number)
    trial = study.ask({d.name: distribution(d) for d in dims})
    return {d.name: decode(d, trial.params[d.name]) for d in dims}


def prune_verdicts(
    spec: TorchTuneSpec, study: optuna.Study, ids: dict[int, int], records: list[TrialRecord]
) -> tuple[set[int], dict[int, dict[str, Any]]]:
    """Running trials the pruner stops, and the system attributes optuna wrote for each."""
    if spec.pruner.type is PrunerType.NONE:
        return set(), {}
    pruned: set[int] = set()
    attrs: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.state is not TrialState.RUNNING or not r.intermediate:
            continue
        frozen = study._storage.get_trial(ids[r.number])
        if study.pruner.prune(study, frozen):
            pruned.add(r.number)
        after = study._storage.get_trial(ids[r.number]).system_attrs
        if after != (r.system_attrs or {}):
            attrs[r.number] = dict(after)
    return pruned, attrs


__all__ = ["DEFAULT_MAX_TRIALS", "max_trials", "optuna_study", "prune_verdicts", "sample_params"]
