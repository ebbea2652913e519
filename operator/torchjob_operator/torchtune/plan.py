"""The decisions of a TorchTune study: pure, typed, unit-tested (tests/unit/test_study_planner.py).

``plan_study(tune, jobs, now)`` reads the TorchTune object and its trial TorchJobs as the
operator's cache holds them and returns the next status and the actions (create these trial
TorchJobs, prune those). No I/O.

**The status is the study's storage.** ``status.trials`` lists every trial: number, TorchJob
name, parameters, state, objective value per progress step, and optuna's per-trial system
attributes. Each call rebuilds an in-memory optuna study from that list (``replay.optuna_study``)
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

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from torchjob.api.models import Condition
from torchjob.api.torchtune import (
    TERMINAL_TRIAL_STATES,
    BestTrial,
    Mode,
    StudyPhase,
    TorchTuneSpec,
    TorchTuneStatus,
    TrialRecord,
    TrialState,
)
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.clock import format_time, parse_time
from torchjob_operator.common.conditions import set_condition
from torchjob_operator.common.events import Event
from torchjob_operator.torchtune.replay import (
    max_trials,
    optuna_study,
    prune_verdicts,
    sample_params,
)
from torchjob_operator.torchtune.trials import (
    ended,
    live,
    observe_trial,
    trial_job_name,
    trial_manifest,
)


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
    events: list[Event] = field(default_factory=list)
    """To post on the TorchTune (reasons from ``conditions.REASONS``, as a TorchJob's)."""


def _best(spec: TorchTuneSpec, records: list[TrialRecord]) -> TrialRecord | None:
    done = [r for r in records if r.state is TrialState.SUCCEEDED and r.value is not None]
    if not done:
        return None
    sign = 1.0 if spec.objective.mode is Mode.MIN else -1.0
    return min(done, key=lambda r: (sign * (r.value or 0.0), r.number))


def _conditions(
    old: list[Condition],
    wanted: list[tuple[str, bool, str, str]],
    generation: int | None,
    now: str,
) -> list[Condition]:
    """Exactly the ``wanted`` (type, status, reason, message) conditions, each set with the
    TorchJob controller's ``set_condition`` (the transition time moves only on a flip)."""
    old_wire = [c.to_wire() for c in old]
    out = []
    for type_, ok, reason, message in wanted:
        assert type_ in cond.CONDITION_TYPES, f"condition type {type_} is not declared"
        assert cond.declared(reason), f"reason {reason} is not in conditions.REASONS"
        new, _ = set_condition(
            [c for c in old_wire if c.get("type") == type_][:1],
            type_=type_,
            status=ok,
            reason=reason,
            message=message,
            now=now,
            observed_generation=generation,
        )
        out.append(Condition.model_validate(new[0]))
    return out


def plan_study(
    tune: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any] | None], now: datetime
) -> StudyPlan:
    """The next status of a TorchTune and what to do; ``jobs`` maps each recorded trial's
    TorchJob name to the object (``None``: it does not exist)."""
    meta = tune.get("metadata") or {}
    name = str(meta.get("name"))
    generation = meta.get("generation")
    stamp = format_time(now)
    try:
        status = TorchTuneStatus.model_validate(dict(tune.get("status") or {}))
    except ValidationError:
        status = TorchTuneStatus()
    old_conditions = list(status.conditions or [])
    try:
        spec = TorchTuneSpec.model_validate(tune.get("spec") or {})
    except ValidationError as err:
        return _invalid_spec(status, err, generation, stamp)

    plan = StudyPlan(status={})
    records = [
        observe_trial(r, jobs.get(r.name), spec.objective.metric, stamp)
        for r in status.trials or []
    ]
    finished = status.phase in (StudyPhase.SUCCEEDED, StudyPhase.FAILED)
    start = parse_time(status.start_time) or now
    status.start_time = format_time(start)
    study, ids = optuna_study(name, spec, records)
    limit = max_trials(spec)
    stopped: Event | None = None
    if not finished:
        _prune(plan, spec, study, ids, records, stamp)
        stopped = _stopped(plan, spec, records, start, now)
        if stopped is not None:
            _stop_every_trial(plan, status, records, stopped, stamp)
        else:
            _sample_trials(plan, status, spec, study, name, records, limit, stamp)
    _actions(plan, tune, spec, status, records, jobs)
    _count(status, spec, records, limit, generation)
    wanted = _wanted_conditions(status, records, spec, limit, stopped, old_conditions)
    status.conditions = _conditions(old_conditions, wanted, generation, stamp)
    plan.status = status.to_wire()
    return plan


def _invalid_spec(
    status: TorchTuneStatus, err: ValidationError, generation: Any, stamp: str
) -> StudyPlan:
    """A spec the models refuse (the CRD's schema let it through): the study fails, saying
    which field."""
    message = "; ".join(
        f"spec.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()
    )
    status.phase = StudyPhase.FAILED
    status.conditions = _conditions(
        list(status.conditions or []),
        [
            (cond.READY, False, "InvalidSpec", message),
            (cond.FAILED, True, "InvalidSpec", message),
            (cond.STALLED, True, "InvalidSpec", message),
        ],
        generation,
        stamp,
    )
    status.observed_generation = generation
    return StudyPlan(
        status=status.to_wire(), events=[Event.of("InvalidSpec", warning=True, detail=message)]
    )


def _prune(
    plan: StudyPlan,
    spec: TorchTuneSpec,
    study: Any,
    ids: Any,
    records: list[TrialRecord],
    stamp: str,
) -> None:
    """Mark the trials the pruner stops (from their reported intermediate values)."""
    verdicts, attrs = prune_verdicts(spec, study, ids, records)
    for r in records:
        if r.number in attrs:
            r.system_attrs = attrs[r.number]
        if r.number in verdicts:
            r.state, r.completion_time = TrialState.PRUNED, stamp
            r.message = f"pruned by the {spec.pruner.type.value} pruner at step {r.step}"
            plan.events.append(Event.of("TrialPruned", trial=r.name, detail=r.message))


def _stopped(
    plan: StudyPlan,
    spec: TorchTuneSpec,
    records: list[TrialRecord],
    start: datetime,
    now: datetime,
) -> Event | None:
    """Why the study stops now (too many failed trials, its deadline), or None; a study with
    a deadline still ahead is looked at again then."""
    failed = sum(r.state is TrialState.FAILED for r in records)
    deadline = spec.active_deadline_seconds
    if failed > spec.max_failed_trials:
        return Event.of(
            "TooManyFailedTrials", warning=True, failed=failed, limit=spec.max_failed_trials
        )
    if deadline is not None and now >= start + timedelta(seconds=deadline):
        return Event.of("StudyDeadlineExceeded", warning=True, deadline=deadline)
    if deadline is not None:
        plan.requeue_after_s = max(1.0, (start + timedelta(seconds=deadline) - now).total_seconds())
    return None


def _stop_every_trial(
    plan: StudyPlan,
    status: TorchTuneStatus,
    records: list[TrialRecord],
    stopped: Event,
    stamp: str,
) -> None:
    for r in records:
        if r.state not in TERMINAL_TRIAL_STATES:
            r.state, r.completion_time = TrialState.FAILED, stamp
            r.message = f"stopped: {stopped.message}"
            plan.stop.append(r.name)
    status.phase, status.completion_time = StudyPhase.FAILED, stamp
    plan.events.append(stopped)


def _sample_trials(
    plan: StudyPlan,
    status: TorchTuneStatus,
    spec: TorchTuneSpec,
    study: Any,
    name: str,
    records: list[TrialRecord],
    limit: int,
    stamp: str,
) -> None:
    """Sample new trials up to the parallelism and the trial limit; the study succeeds once
    every trial of the limit has ended."""
    active = [r for r in records if r.state not in TERMINAL_TRIAL_STATES]
    while len(active) < spec.parallelism and len(records) < limit:
        number = len(records)
        record = TrialRecord(
            number=number,
            name=trial_job_name(name, number),
            params=sample_params(spec, study, number),
            state=TrialState.PENDING,
            start_time=stamp,
        )
        records.append(record)
        active.append(record)
    if not active and len(records) >= limit:
        status.phase, status.completion_time = StudyPhase.SUCCEEDED, stamp
        best = _best(spec, records)
        plan.events.append(
            Event.of("StudySucceeded", count=len(records), best=best.name if best else "none")
        )


def _actions(
    plan: StudyPlan,
    tune: Mapping[str, Any],
    spec: TorchTuneSpec,
    status: TorchTuneStatus,
    records: list[TrialRecord],
    jobs: Mapping[str, Mapping[str, Any] | None],
) -> None:
    """The writes, repeated until the world shows them (idempotent)."""
    for r in records:
        job = jobs.get(r.name)
        if r.state is TrialState.PENDING and job is None:
            plan.create.append(trial_manifest(tune, spec, r))
        elif r.state is TrialState.PRUNED and job is not None and not ended(job):
            plan.prune.append(r.name)
    if status.phase is StudyPhase.FAILED:
        plan.stop = sorted(
            r.name for r in records if (j := jobs.get(r.name)) is not None and live(j)
        )


def _count(
    status: TorchTuneStatus,
    spec: TorchTuneSpec,
    records: list[TrialRecord],
    limit: int,
    generation: Any,
) -> None:
    """The trial counters, the progress, the best trial and the phase."""
    best = _best(spec, records)
    status.trials = records
    status.trials_created = len(records)
    status.trials_running = sum(
        r.state in (TrialState.PENDING, TrialState.RUNNING) for r in records
    )
    status.trials_succeeded = sum(r.state is TrialState.SUCCEEDED for r in records)
    status.trials_pruned = sum(r.state is TrialState.PRUNED for r in records)
    status.trials_failed = sum(r.state is TrialState.FAILED for r in records)
    status.progress = f"{len(records) - status.trials_running}/{limit}"
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


def _wanted_conditions(
    status: TorchTuneStatus,
    records: list[TrialRecord],
    spec: TorchTuneSpec,
    limit: int,
    stopped: Event | None,
    old_conditions: list[Any],
) -> list[tuple[str, bool, str, str]]:
    done = len(records) - (status.trials_running or 0)
    if status.phase is StudyPhase.SUCCEEDED:
        best = _best(spec, records)
        text = f"{done} trials finished" + (f"; best {best.name} = {best.value}" if best else "")
        return [
            (cond.READY, True, "StudySucceeded", text),
            (cond.COMPLETE, True, "StudySucceeded", text),
        ]
    if status.phase is StudyPhase.FAILED:
        said = next((c for c in old_conditions if c.type == cond.FAILED), None)
        text = (
            stopped.message if stopped else (said.message if said else cond.message("StudyFailed"))
        )
        why = stopped.reason if stopped else (said.reason if said else "StudyFailed")
        # Stalled=True: what kstatus reads as Failed (Argo CD reads phase Failed as Degraded).
        return [
            (cond.READY, False, why, text),
            (cond.FAILED, True, why, text),
            (cond.STALLED, True, why, text),
        ]
    text = cond.message("TrialsRunning", running=status.trials_running, done=done, limit=limit)
    # Ready=True while the trials run, and no Reconciling condition: kstatus says Current
    # (the study is doing what its spec asks), as Argo CD says Healthy.
    return [(cond.READY, True, "TrialsRunning", text)]
