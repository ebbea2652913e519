"""The decisions of a TorchTune study: pure, typed, unit-tested (tests/unit/test_study_planner.py).

``plan_study(tune, jobs, now)`` reads the TorchTune object and its trial TorchJobs as the
operator's cache holds them and returns the next status and the actions (create these trial
TorchJobs, prune those). No I/O.

**The status is the study's storage.** ``status.trials`` lists every trial: number, TorchJob
name, parameters, state, objective value per progress step, and optuna's per-trial system
attributes. Each call rebuilds an in-memory optuna study from that list (``optuna_study``)
and asks optuna's sampler and pruner, then writes back what optuna wrote. Why the status
rather than a ConfigMap journal: one object, one write, guarded by its resourceVersion, so
the record of a trial and the counts derived from it change together or not at all; a
journal beside it would need a second write that can be lost between the two. Measured
(tests/unit/test_study_planner.py): 1,000 trials of 3 parameters with 10 progress steps
each take 479 KB of status (479 B a trial), a third of the API server's 1.5 MiB object
limit; hence ``spec.maxTrials`` <= 2,000.

**Exactly once.** A trial is recorded (``Pending``, with its number, name and parameters)
in the status write *before* its TorchJob is created; its TorchJob's name is
``<study>-t<number>``. An operator killed between the two writes finds the record and
creates the TorchJob again (AlreadyExists is success); an operator killed before the status
write never created anything. A trial's state only moves forward (Pending -> Running ->
Succeeded/Pruned/Failed), and the counts are computed from the records, never incremented,
so a reconcile repeated on the same world changes nothing.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from pydantic import ValidationError

from torchjob import contract
from torchjob.api.models import Condition, TorchJobStatus
from torchjob.api.tune import (
    TERMINAL_TRIAL_STATES,
    BestTrial,
    Mode,
    Parameter,
    ParameterType,
    PrunerType,
    SamplerType,
    StudyPhase,
    TorchTuneSpec,
    TorchTuneStatus,
    TrialRecord,
    TrialState,
)
from torchjob.plan.trial import nested_config

STUDY_LABEL = "torchjob.io/tune-study"
TRIAL_LABEL = "torchjob.io/tune-trial"
DEFAULT_MAX_TRIALS = 10

_PRIMITIVE = (type(None), bool, int, float, str)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def trial_job_name(study: str, number: int) -> str:
    return f"{study}-t{number}"


# --- the search space as optuna sees it ----------------------------------------------


def _categorical_choices(p: Parameter) -> list[Any]:
    values = list(p.values or [])
    return values if all(isinstance(v, _PRIMITIVE) for v in values) else list(range(len(values)))


def distribution(p: Parameter) -> BaseDistribution:
    if p.type is ParameterType.UNIFORM:
        return FloatDistribution(float(p.low or 0.0), float(p.high or 0.0))
    if p.type is ParameterType.LOGUNIFORM:
        return FloatDistribution(float(p.low or 0.0), float(p.high or 0.0), log=True)
    if p.type is ParameterType.INT:
        return IntDistribution(math.ceil(p.low or 0), math.floor(p.high or 0))
    return CategoricalDistribution(_categorical_choices(p))


def _to_optuna(p: Parameter, value: Any) -> Any:
    """A recorded value as optuna stores it (the index for a non-primitive choice)."""
    if p.type in (ParameterType.CATEGORICAL, ParameterType.GRID):
        values = list(p.values or [])
        if not all(isinstance(v, _PRIMITIVE) for v in values):
            return values.index(value)
    return value


def _from_optuna(p: Parameter, value: Any) -> Any:
    if p.type in (ParameterType.CATEGORICAL, ParameterType.GRID):
        values = list(p.values or [])
        if not all(isinstance(v, _PRIMITIVE) for v in values):
            return values[int(value)]
    return value


def grid_points(spec: TorchTuneSpec) -> list[dict[str, Any]]:
    """Every point of the grid sampler's space, in a fixed order (first parameter slowest)."""
    points: list[dict[str, Any]] = [{}]
    for p in spec.search_space:
        points = [{**point, p.name: v} for point in points for v in p.values or []]
    return points


def max_trials(spec: TorchTuneSpec) -> int:
    if spec.max_trials is not None:
        return int(spec.max_trials)
    if spec.sampler.type is SamplerType.GRID:
        return len(grid_points(spec))
    return DEFAULT_MAX_TRIALS


# --- optuna, rebuilt from the status ----------------------------------------------------


def _sampler(spec: TorchTuneSpec, number: int) -> optuna.samplers.BaseSampler:
    seed = None if spec.sampler.seed is None else spec.sampler.seed + number
    startup = spec.sampler.startup_trials
    if spec.sampler.type is SamplerType.RANDOM:
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler.type is SamplerType.CMAES:
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            n_startup_trials=1 if startup is None else startup,
            warn_independent_sampling=False,
        )
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=10 if startup is None else startup
    )


def _pruner(spec: TorchTuneSpec) -> optuna.pruners.BasePruner:
    p = spec.pruner
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
    direction = (
        optuna.study.StudyDirection.MINIMIZE
        if spec.objective.mode is Mode.MIN
        else optuna.study.StudyDirection.MAXIMIZE
    )
    study = optuna.create_study(
        study_name=name,
        direction=direction,
        sampler=_sampler(spec, sampler_for),
        pruner=_pruner(spec),
        storage=optuna.storages.InMemoryStorage(),
    )
    by_name = {p.name: p for p in spec.search_space}
    ids: dict[int, int] = {}
    for r in sorted(records, key=lambda r: r.number):
        state = _OPTUNA_STATE[r.state]
        if state is optuna.trial.TrialState.COMPLETE and r.value is None:
            state = optuna.trial.TrialState.FAIL
        params = {k: _to_optuna(by_name[k], v) for k, v in r.params.items() if k in by_name}
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
    if spec.sampler.type is SamplerType.GRID or study is None:
        points = grid_points(spec)
        return dict(points[number % len(points)])
    study.sampler = _sampler(spec, number)
    trial = study.ask({p.name: distribution(p) for p in spec.search_space})
    return {p.name: _from_optuna(p, trial.params[p.name]) for p in spec.search_space}


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


# --- the trial TorchJob -------------------------------------------------------------


def trial_manifest(
    tune: Mapping[str, Any], spec: TorchTuneSpec, record: TrialRecord
) -> dict[str, Any]:
    """The TorchJob of one trial: the template's spec, named ``<study>-t<n>``, owned by the
    TorchTune (deleted with it), its parameters in ``TORCHJOB_TUNE_CONFIG`` of every
    container (what ``torchjob.tune.get_trial_config`` reads), its own checkpoint directory."""
    meta = tune.get("metadata") or {}
    study = str(meta.get("name"))
    template_meta = spec.trial_template.metadata
    labels = dict((template_meta.labels if template_meta else None) or {})
    labels.update({STUDY_LABEL: study, TRIAL_LABEL: str(record.number)})
    job_meta: dict[str, Any] = {
        "name": record.name,
        "namespace": meta.get("namespace"),
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": tune.get("apiVersion", "torchjob.io/v1alpha1"),
                "kind": "TorchTune",
                "name": study,
                "uid": meta.get("uid"),
                "controller": True,
            }
        ],
    }
    if template_meta and template_meta.annotations:
        job_meta["annotations"] = dict(template_meta.annotations)
    job_spec = copy.deepcopy(spec.trial_template.spec.to_wire())
    encoded = json.dumps(nested_config(record.params), sort_keys=True, default=str)
    for c in ((job_spec.get("template") or {}).get("spec") or {}).get("containers") or []:
        env = [
            e
            for e in c.get("env") or []
            if e.get("name") not in (contract.TUNE_CONFIG, contract.TUNE_TRIAL)
        ]
        env += [
            {"name": contract.TUNE_CONFIG, "value": encoded},
            {"name": contract.TUNE_TRIAL, "value": str(record.number)},
        ]
        c["env"] = env
    ckpt = job_spec.get("checkpoint")
    if isinstance(ckpt, dict):
        base = ckpt.get("path") or (ckpt.get("pvc") or {}).get("mountPath") or "/checkpoints"
        ckpt["path"] = f"{str(base).rstrip('/')}/{record.name}"
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": job_meta,
        "spec": job_spec,
    }


# --- the plan -------------------------------------------------------------------------


@dataclass
class StudyPlan:
    status: dict[str, Any]
    """The whole new status (wire form), to write with the object's resourceVersion."""
    create: list[dict[str, Any]] = field(default_factory=list)
    """Trial TorchJobs to create (AlreadyExists is success)."""
    prune: list[str] = field(default_factory=list)
    """Trial TorchJobs to end with ``spec.pruneAction`` (delete, or suspend)."""
    stop: list[str] = field(default_factory=list)
    """Trial TorchJobs to delete because the study ended (deadline, too many failures)."""
    requeue_after_s: float | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) to post on the TorchTune."""


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _ended(job: Mapping[str, Any]) -> bool:
    """The TorchJob is going or suspended: a prune already took effect."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    return bool(meta.get("deletionTimestamp")) or bool((spec.get("runPolicy") or {}).get("suspend"))


def _live(job: Mapping[str, Any]) -> bool:
    """The TorchJob still runs (or waits to): neither finished nor ended by us."""
    phase = (job.get("status") or {}).get("phase")
    return not _ended(job) and phase not in ("Succeeded", "Failed")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return None if math.isnan(v) else v


def observe_trial(
    record: TrialRecord, job: Mapping[str, Any] | None, metric: str, now: str
) -> TrialRecord:
    """The record after looking at its TorchJob (forward moves only)."""
    r = record.model_copy(deep=True)
    if r.state in TERMINAL_TRIAL_STATES:
        return r
    if job is None:
        if r.state is TrialState.RUNNING:
            r.state, r.message, r.completion_time = (
                TrialState.FAILED,
                "its TorchJob was deleted",
                now,
            )
        return r
    if r.state is TrialState.PENDING:
        r.state = TrialState.RUNNING
    status = TorchJobStatus.parse(job.get("status"))
    progress = status.progress
    if progress is not None and progress.step is not None and progress.step > (r.step or 0):
        metrics = dict(progress.metrics or {})
        r.step = progress.step
        value = _number(metrics.get(metric))
        if value is not None:
            r.value = value
            r.intermediate = {**(r.intermediate or {}), str(progress.step): value}
    if progress is not None and progress.last_checkpoint:
        r.checkpoint = progress.last_checkpoint
    phase = status.phase.value if status.phase is not None else None
    if phase == "Succeeded":
        r.completion_time = now
        if r.value is None:
            reported = sorted((progress.metrics or {}) if progress else {})
            r.state = TrialState.FAILED
            r.message = (
                f"the trial succeeded without reporting the objective metric {metric!r}; "
                f"it reported: {', '.join(reported) or 'nothing'}"
            )
        else:
            r.state = TrialState.SUCCEEDED
    elif phase == "Failed":
        r.state, r.completion_time = TrialState.FAILED, now
        last = status.last_failure
        r.message = "its TorchJob failed" + (f": {last.message or last.reason}" if last else "")
    return r


def _best(spec: TorchTuneSpec, records: list[TrialRecord]) -> TrialRecord | None:
    done = [r for r in records if r.state is TrialState.SUCCEEDED and r.value is not None]
    if not done:
        return None
    sign = 1.0 if spec.objective.mode is Mode.MIN else -1.0
    return min(done, key=lambda r: (sign * (r.value or 0.0), r.number))


def _condition(
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
    old: list[Condition],
) -> Condition:
    status: Literal["True", "False"] = "True" if ok else "False"
    previous = next((c for c in old if c.type == kind), None)
    since = previous.last_transition_time if previous and previous.status == status else now
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def plan_study(
    tune: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any] | None], now: datetime
) -> StudyPlan:
    """The next status of a TorchTune and what to do; ``jobs`` maps each recorded trial's
    TorchJob name to the object (``None``: it does not exist)."""
    meta = tune.get("metadata") or {}
    name = str(meta.get("name"))
    generation = meta.get("generation")
    stamp = _iso(now)
    raw_status = dict(tune.get("status") or {})
    try:
        status = TorchTuneStatus.model_validate(raw_status)
    except ValidationError:
        status = TorchTuneStatus()
    old_conditions = list(status.conditions or [])
    try:
        spec = TorchTuneSpec.model_validate(tune.get("spec") or {})
    except ValidationError as err:
        message = "; ".join(
            f"spec.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        status.phase = StudyPhase.FAILED
        status.conditions = [
            _condition("Ready", False, "InvalidSpec", message, generation, stamp, old_conditions),
            _condition("Failed", True, "InvalidSpec", message, generation, stamp, old_conditions),
        ]
        status.observed_generation = generation
        return StudyPlan(status=status.to_wire(), events=[("Warning", "InvalidSpec", message)])

    plan = StudyPlan(status={})
    records = [
        observe_trial(r, jobs.get(r.name), spec.objective.metric, stamp)
        for r in status.trials or []
    ]
    finished = status.phase in (StudyPhase.SUCCEEDED, StudyPhase.FAILED)
    start = _parse_time(status.start_time) or now
    status.start_time = _iso(start)

    study, ids = optuna_study(name, spec, records)
    if not finished:
        verdicts, attrs = prune_verdicts(spec, study, ids, records)
        for r in records:
            if r.number in attrs:
                r.system_attrs = attrs[r.number]
            if r.number in verdicts:
                r.state, r.completion_time = TrialState.PRUNED, stamp
                r.message = f"pruned by the {spec.pruner.type.value} pruner at step {r.step}"
                plan.events.append(("Normal", "TrialPruned", f"{r.name}: {r.message}"))

    failed = sum(r.state is TrialState.FAILED for r in records)
    limit = max_trials(spec)
    reason, message = "", ""
    if not finished:
        deadline = spec.active_deadline_seconds
        if failed > spec.max_failed_trials:
            reason = "TooManyFailedTrials"
            message = (
                f"{failed} trials failed, more than spec.maxFailedTrials={spec.max_failed_trials}"
            )
        elif deadline is not None and now >= start + timedelta(seconds=deadline):
            reason = "DeadlineExceeded"
            message = f"the study ran longer than spec.activeDeadlineSeconds={deadline}"
        elif deadline is not None:
            plan.requeue_after_s = max(
                1.0, (start + timedelta(seconds=deadline) - now).total_seconds()
            )
        if reason:
            for r in records:
                if r.state not in TERMINAL_TRIAL_STATES:
                    r.state, r.completion_time = TrialState.FAILED, stamp
                    r.message = f"stopped: {message}"
                    plan.stop.append(r.name)
            status.phase, status.completion_time = StudyPhase.FAILED, stamp
            plan.events.append(("Warning", reason, message))

    active = [r for r in records if r.state not in TERMINAL_TRIAL_STATES]
    if not finished and not reason:
        while len(active) < spec.parallelism and len(records) < limit:
            number = len(records)
            params = sample_params(spec, study, number)
            record = TrialRecord(
                number=number,
                name=trial_job_name(name, number),
                params=params,
                state=TrialState.PENDING,
                start_time=stamp,
            )
            records.append(record)
            active.append(record)
        if not active and len(records) >= limit:
            status.phase, status.completion_time = StudyPhase.SUCCEEDED, stamp
            best = _best(spec, records)
            plan.events.append(
                (
                    "Normal",
                    "StudySucceeded",
                    f"{len(records)} trials; best: {best.name if best else 'none'}",
                )
            )

    # Actions, repeated until the world shows them (idempotent).
    for r in records:
        job = jobs.get(r.name)
        if r.state is TrialState.PENDING and job is None:
            plan.create.append(trial_manifest(tune, spec, r))
        elif r.state is TrialState.PRUNED and job is not None and not _ended(job):
            plan.prune.append(r.name)
    if status.phase is StudyPhase.FAILED:
        plan.stop = sorted(
            r.name for r in records if (j := jobs.get(r.name)) is not None and _live(j)
        )

    best = _best(spec, records)
    status.trials = records
    status.trials_created = len(records)
    status.trials_running = sum(
        r.state in (TrialState.PENDING, TrialState.RUNNING) for r in records
    )
    status.trials_succeeded = sum(r.state is TrialState.SUCCEEDED for r in records)
    status.trials_pruned = sum(r.state is TrialState.PRUNED for r in records)
    status.trials_failed = sum(r.state is TrialState.FAILED for r in records)
    done = len(records) - status.trials_running
    status.progress = f"{done}/{limit}"
    status.best_trial = (
        BestTrial(
            number=best.number,
            name=best.name,
            params=best.params,
            value=best.value,
            checkpoint=best.checkpoint,
        )
        if best is not None and best.value is not None
        else None
    )
    status.best_value = status.best_trial.value if status.best_trial else None
    status.phase = status.phase or StudyPhase.RUNNING
    status.observed_generation = generation
    if status.phase is StudyPhase.SUCCEEDED:
        text = f"{done} trials finished" + (f"; best {best.name} = {best.value}" if best else "")
        status.conditions = [
            _condition("Ready", True, "StudySucceeded", text, generation, stamp, old_conditions),
            _condition("Complete", True, "StudySucceeded", text, generation, stamp, old_conditions),
        ]
    elif status.phase is StudyPhase.FAILED:
        text = message or next((c.message for c in old_conditions if c.type == "Failed"), "failed")
        why = reason or next((c.reason for c in old_conditions if c.type == "Failed"), "Failed")
        status.conditions = [
            _condition("Ready", False, why, text, generation, stamp, old_conditions),
            _condition("Failed", True, why, text, generation, stamp, old_conditions),
        ]
    else:
        text = f"{status.trials_running} running, {done}/{limit} finished"
        status.conditions = [
            _condition("Ready", False, "TrialsRunning", text, generation, stamp, old_conditions),
            _condition(
                "Reconciling", True, "TrialsRunning", text, generation, stamp, old_conditions
            ),
        ]
    plan.status = status.to_wire()
    return plan
