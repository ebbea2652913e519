"""The reconcile decision: (spec, the job's status, observed pods, clock) -> Plan.

``plan`` is the Kubernetes view over the shared decisions in ``torchjob.plan``
(judgement, failure verdict, counters, deadline) and does no I/O:
``torchjob_operator.reconcile`` reads the world, calls it, and carries the plan
out (creates, then one status patch, then relabels and deletes, then Events).
Calling it twice with the same inputs gives the same plan, and every plan is
safe to carry out twice, which is what makes the operator level-based and
restartable at any moment.

Semantics (docs/api.md explains them for users):

* Membership is decided in *generations*. All pods of a generation carry its
  number; any membership change (failure restart, disruption, rescale, resume)
  starts generation g+1. The status records the new generation before pods of an
  older generation are deleted (they are deleted because their label is older),
  and they are gone before the new generation's pods are created, because they
  share names and rendezvous.
  Under ``membershipPolicy: KeepSurvivors`` the pods that still run where they
  were placed are kept instead and relabelled with g+1; only the lost ones are
  replaced, and the runtime in the pods re-forms the process group.
* The job succeeds when every worker of the current generation exited 0.
* A failure (non-zero exit, no disruption anywhere in the generation) restarts
  the whole group after an exponential backoff, within ``maxRestarts``; a
  permanent exit code fails the job at once.
* A disruption (DisruptionTarget, Kueue's TerminationTarget, node loss, a pod
  deleted by someone else) starts a new generation at once and never consumes
  ``maxRestarts``.
* ``suspend`` deletes the pods and keeps the status; resuming starts a new
  generation and resets the deadline clock (as batch/v1 Job does).
* ``activeDeadlineSeconds`` counts from ``startTime``; ``plan`` asks to be
  called again when it expires, so it is enforced with nothing else happening.
* After the end, ``cleanPodPolicy`` decides which pods go, and
  ``ttlSecondsAfterFinished`` deletes the TorchJob itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from torchjob import contract
from torchjob.api.models import (
    CleanPodPolicy,
    FailureRecord,
    MembershipPolicy,
    Phase,
    TorchJobSpec,
)
from torchjob.plan import (
    Counters,
    Outcome,
    Verdict,
    deadline_left,
    decide_failure,
    judge_generation,
)
from torchjob_operator.planner import conditions as cond
from torchjob_operator.planner.observed import (
    IMAGE_PULL_REASONS,
    JobState,
    PodPhase,
    PodView,
    ProbeView,
    format_time,
)


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    spec: TorchJobSpec
    state: JobState = field(default_factory=JobState)
    metadata_generation: int | None = None


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class CreatePods:
    indices: tuple[int, ...]
    generation: int
    replicas: int


@dataclass(frozen=True)
class Plan:
    create: CreatePods | None
    delete: tuple[str, ...]
    status: dict[str, Any]
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None
    delete_job: bool = False
    ensure_service: bool = True
    create_probes: tuple[int, ...] = ()
    """Capacity probes to create (indices) before an elastic job grows."""
    relabel: tuple[str, ...] = ()
    """KeepSurvivors: pods kept from an earlier generation, to label with the current one."""

    @property
    def phase(self) -> Phase:
        return Phase(self.status["phase"])


@dataclass
class _Draft:
    """Mutable scratch state while one plan is being decided."""

    job: JobView
    now: datetime
    phase: Phase | None
    generation: int
    replicas: int
    restarts: int
    disruptions: int
    start_time: datetime | None
    completion_time: datetime | None
    restart_after: datetime | None
    created_generation: int | None
    last_failure: FailureRecord | None
    spec_replicas: int | None = None
    last_rescale: datetime | None = None
    probes: tuple[ProbeView, ...] = ()
    create_probes: tuple[int, ...] = ()
    keep_probes: bool = False
    reason: str = ""
    message: str = ""
    events: list[Event] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    create: CreatePods | None = None
    requeue: list[float] = field(default_factory=list)
    delete_job: bool = False
    relabel: list[str] = field(default_factory=list)

    def transition(self, phase: Phase, reason: str, message: str, *, warning: bool = False) -> None:
        if phase != self.phase or reason != self.reason:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))
        self.phase, self.reason, self.message = phase, reason, message

    def counters(self) -> Counters:
        return Counters(self.generation, self.restarts, self.disruptions)

    def count(self, counters: Counters, replicas: int) -> None:
        """Adopt the counters of a decision (``torchjob.plan.generation``) and the new size."""
        self.generation, self.restarts, self.disruptions = (
            counters.generation,
            counters.restarts,
            counters.disruptions,
        )
        self.replicas = replicas

    def next_generation(self, replicas: int) -> None:
        """A resize: the next generation, charged to no counter."""
        self.count(self.counters().resized(), replicas)


def _selector(name: str) -> str:
    return f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"


def _counts(pods: Sequence[PodView]) -> dict[str, int]:
    return {
        "readyWorkers": sum(
            1 for p in pods if p.phase == PodPhase.RUNNING and p.ready and not p.deleting
        ),
        "activeWorkers": sum(1 for p in pods if p.active),
        "succeededWorkers": sum(1 for p in pods if p.phase == PodPhase.SUCCEEDED),
        "failedWorkers": sum(1 for p in pods if p.phase == PodPhase.FAILED),
    }


def _status(d: _Draft, current: Sequence[PodView]) -> dict[str, Any]:
    assert d.phase is not None
    now = format_time(d.now)
    obs = d.job.metadata_generation
    conditions = [dict(c) for c in d.job.state.conditions]
    wanted = {
        cond.CREATED: d.start_time is not None or d.created_generation is not None,
        cond.RUNNING: d.phase == Phase.RUNNING,
        cond.RESTARTING: d.phase == Phase.RESTARTING,
        cond.SUSPENDED: d.phase == Phase.SUSPENDED,
        cond.SUCCEEDED: d.phase == Phase.SUCCEEDED,
        cond.FAILED: d.phase == Phase.FAILED,
        cond.READY: d.phase in (Phase.RUNNING, Phase.SUCCEEDED),
        cond.STALLED: d.phase == Phase.FAILED,
    }
    present = {c.get("type") for c in conditions}
    for type_, value in wanted.items():
        if not value and type_ not in present and type_ != cond.READY:
            continue  # False conditions that never were True are noise in `kubectl describe`.
        if type_ == cond.CREATED and value:
            reason, msg = "PodsCreated", f"worker pods created (generation {d.created_generation})"
        elif value or type_ == cond.READY:
            reason, msg = d.reason, d.message
        else:
            reason, msg = d.reason, f"the job is {d.phase.value}"
        conditions, _ = cond.set_condition(
            conditions,
            type_=type_,
            status=value,
            reason=reason,
            message=msg,
            now=now,
            observed_generation=obs,
        )
    counts = _counts(current)
    status: dict[str, Any] = {
        "phase": d.phase.value,
        "conditions": conditions,
        "observedGeneration": obs,
        "replicas": d.replicas,
        "workers": f"{counts['readyWorkers']}/{d.replicas}",
        "selector": _selector(d.job.name),
        "currentGeneration": d.generation,
        "createdGeneration": d.created_generation,
        "specReplicas": d.spec_replicas,
        "lastRescaleTime": format_time(d.last_rescale) if d.last_rescale else None,
        "worldSize": d.replicas * d.job.spec.resolved_nproc_per_node(),
        "restarts": d.restarts,
        "disruptions": d.disruptions,
        "lastFailure": d.last_failure.to_wire() if d.last_failure else None,
        "restartAfter": format_time(d.restart_after) if d.restart_after else None,
        "startTime": format_time(d.start_time) if d.start_time else None,
        "completionTime": format_time(d.completion_time) if d.completion_time else None,
        **counts,
    }
    return status


def _finish(d: _Draft, pods: Sequence[PodView], *, deadline: bool = False) -> None:
    """Pod clean-up after the end, and the TTL of the finished job."""
    policy = d.job.spec.run_policy.clean_pod_policy
    for p in pods:
        if p.deleting:
            continue
        if policy == CleanPodPolicy.ALL or (
            (policy == CleanPodPolicy.RUNNING or deadline) and p.active
        ):
            d.delete.append(p.name)
    ttl = d.job.spec.run_policy.ttl_seconds_after_finished
    if ttl is not None:
        end = d.completion_time or d.now
        due = end + timedelta(seconds=ttl)
        if d.now >= due:
            d.delete_job = True
        else:
            d.requeue.append((due - d.now).total_seconds())


def _end(d: _Draft, phase: Phase, reason: str, message: str) -> None:
    d.transition(phase, reason, message, warning=phase == Phase.FAILED)
    d.completion_time = d.now
    d.restart_after = None


def _survives(p: PodView) -> bool:
    """A pod worth keeping into a new generation: placed, alive, and not being taken away."""
    return p.active and p.scheduled and p.disruption is None


def _members(d: _Draft, pods: Sequence[PodView]) -> list[PodView]:
    """The pods of the current generation: those labelled with it and, under KeepSurvivors,
    pods of earlier generations that survive (the plan relabels them). Everything else is
    stale and goes before new pods are created, since names and rendezvous are shared."""
    keep = d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS
    return [
        p
        for p in pods
        if p.index < d.replicas
        and (
            p.generation == d.generation or (keep and p.generation < d.generation and _survives(p))
        )
    ]


def plan(
    job: JobView, pods: Sequence[PodView], now: datetime, probes: Sequence[ProbeView] = ()
) -> Plan:
    """Decide what the job's pods and status should become. Pure; see the module docstring."""
    st, spec = job.state, job.spec
    d = _Draft(
        job=job,
        now=now,
        phase=st.phase,
        generation=st.generation,
        replicas=st.replicas or spec.replicas,
        restarts=st.restarts,
        disruptions=st.disruptions,
        start_time=st.start_time,
        completion_time=st.completion_time,
        restart_after=st.restart_after,
        created_generation=st.created_generation,
        last_failure=st.last_failure,
        spec_replicas=st.spec_replicas,
        last_rescale=st.last_rescale,
        probes=tuple(probes),
    )
    d.reason, d.message = _ready_reason(st)

    if st.phase is not None and st.phase.is_terminal:
        _finish(d, pods)
        return _plan(d, pods, pods)

    if spec.run_policy.suspend:
        d.delete.extend(p.name for p in pods if not p.deleting)
        d.start_time = None
        d.restart_after = None
        d.transition(Phase.SUSPENDED, "Suspended", cond.message("Suspended"))
        return _plan(d, pods, [])

    if st.phase is None:
        d.transition(Phase.PENDING, "WaitingForPods", "waiting for worker pods to be created")
    elif st.phase == Phase.SUSPENDED:
        d.next_generation(spec.replicas)
        d.transition(Phase.PENDING, "Resumed", cond.message("Resumed"))

    deadline = spec.run_policy.active_deadline_seconds
    left = deadline_left(deadline, d.start_time, now)
    if left is not None:
        if left <= 0:
            _end(
                d,
                Phase.FAILED,
                "DeadlineExceeded",
                cond.message("DeadlineExceeded", deadline=deadline),
            )
            _finish(d, pods, deadline=True)
            return _plan(d, pods, pods)
        d.requeue.append(left)

    # A user's scale (spec.replicas changed) always starts a generation of the new size. An
    # elastic job may run below spec.replicas after a shrink; that is not a scale request.
    user_scaled = d.spec_replicas is not None and d.spec_replicas != spec.replicas
    if spec.replicas != d.replicas and (user_scaled or spec.elastic is None):
        if d.created_generation == d.generation:
            old = d.replicas
            d.next_generation(spec.replicas)
            d.restart_after = None
            d.transition(
                Phase.RESTARTING,
                "Rescaled",
                cond.message("Rescaled", old=old, replicas=d.replicas, generation=d.generation),
            )
        else:  # nothing created for this generation yet: just adopt the new size
            d.replicas = spec.replicas
    d.spec_replicas = spec.replicas

    current = _members(d, pods)
    missing: list[int] = []
    if d.created_generation == d.generation:
        have = {p.index for p in current}
        missing = [i for i in range(d.replicas) if i not in have]
    verdict = judge_generation(current, replicas=d.replicas, missing=missing, now=now)
    if verdict.recheck_after_s is not None:
        d.requeue.append(verdict.recheck_after_s)

    if verdict.outcome == Outcome.SUCCEEDED:
        _end(
            d,
            Phase.SUCCEEDED,
            "AllWorkersSucceeded",
            cond.message("AllWorkersSucceeded", replicas=d.replicas),
        )
        _finish(d, pods)
        return _plan(d, pods, current)

    if verdict.outcome == Outcome.DISRUPTED:
        d.count(d.counters().disrupted(), spec.replicas)
        d.restart_after = None
        d.transition(
            Phase.RESTARTING,
            "WorkerDisrupted",
            cond.message("WorkerDisrupted", detail=verdict.detail, disruptions=d.disruptions),
            warning=True,
        )
    elif verdict.outcome == Outcome.FAILED:
        culprit = verdict.culprit
        assert isinstance(culprit, PodView)
        d.last_failure = FailureRecord(
            pod=culprit.name,
            exit_code=culprit.exit_code,
            reason=culprit.reason or "Error",
            message=(culprit.summary or culprit.message)[:1024],
            time=format_time(culprit.finished_at or now),
        )
        decision = decide_failure(
            culprit.exit_code, restarts=d.restarts, policy=spec.failure_policy
        )
        text = cond.message("WorkerFailed", detail=verdict.detail, explanation=decision.explanation)
        if decision.verdict != Verdict.RESTART_GROUP:
            _end(d, Phase.FAILED, decision.verdict.value, text)
            _finish(d, pods)
            return _plan(d, pods, current)
        d.count(d.counters().restarted(decision), spec.replicas)
        d.restart_after = now + timedelta(seconds=decision.backoff_s)
        d.transition(Phase.RESTARTING, "WorkerFailed", text, warning=True)

    if spec.elastic is not None and verdict.outcome == Outcome.HEALTHY:
        _fit_to_capacity(d, current)

    # Pods of another generation (or beyond the group) go first: they share names and rendezvous.
    current = _members(d, pods)
    stale = [p for p in pods if p not in current]
    d.delete.extend(p.name for p in stale if not p.deleting)
    kept = [p for p in current if p.generation != d.generation]
    if kept:
        d.relabel = [p.name for p in kept]
        d.events.append(
            Event(
                "Normal",
                "KeptSurvivors",
                f"generation {d.generation} keeps {len(kept)} running worker(s) "
                f"({', '.join(p.name for p in kept)}); the rest are replaced",
            )
        )

    waiting_backoff = d.restart_after is not None and now < d.restart_after
    if waiting_backoff and d.restart_after is not None:
        seconds = (d.restart_after - now).total_seconds()
        d.requeue.append(seconds)
        d.message = (
            f"{d.message.split('; restarting in')[0]}; restarting in {int(seconds + 0.999)}s"
        )
    elif not stale:
        have = {p.index for p in current}
        todo = tuple(i for i in range(d.replicas) if i not in have)
        if todo and d.created_generation != d.generation:
            d.create = CreatePods(indices=todo, generation=d.generation, replicas=d.replicas)
            d.created_generation = d.generation
            d.restart_after = None
            if d.start_time is None:
                d.start_time = now
            d.events.append(
                Event(
                    "Normal",
                    "PodsCreated",
                    cond.message("PodsCreated", replicas=len(todo), generation=d.generation),
                )
            )
        elif not todo and d.created_generation != d.generation:
            # Every pod exists already (an earlier operator created them and died before
            # writing the status): adopt them.
            d.created_generation = d.generation
            d.restart_after = None
            if d.start_time is None:
                d.start_time = now

    _active_phase(d, current)
    return _plan(d, pods, current)


def _fit_to_capacity(d: _Draft, current: Sequence[PodView]) -> None:
    """Elastic jobs: shrink to what fits, grow back when capacity returns.

    Shrink: workers unschedulable for ``scaleDownAfterSeconds`` are dropped and the
    job continues with the workers that were placed (never below minReplicas; below
    it the job waits and says why). Grow: after ``scaleUpCooldownSeconds`` since the
    last change, worker-sized probe pods test for room; only when every probe is
    placed does a new generation of ``spec.replicas`` start, so flapping capacity
    costs probes, not training restarts.
    """
    el = d.job.spec.elastic
    assert el is not None
    if d.created_generation != d.generation:
        return
    alive = [p for p in current if not p.deleting]
    placed = sum(1 for p in alive if p.scheduled)
    waiting = [p for p in alive if p.unschedulable_since is not None]
    if waiting:
        first = min(p.unschedulable_since for p in waiting if p.unschedulable_since)
        due = first + timedelta(seconds=el.scale_down_after_seconds)
        if d.now < due:
            d.requeue.append((due - d.now).total_seconds())
            return
        if placed < el.min_replicas:
            d.transition(
                Phase.PENDING,
                "WaitingForCapacity",
                f"only {placed} of at least {el.min_replicas} workers fit; waiting for capacity",
            )
            return
        if placed < d.replicas:
            old = d.replicas
            d.next_generation(placed)
            d.last_rescale = d.now
            d.transition(
                Phase.RESTARTING,
                "ScaledDown",
                f"{old - placed} of {old} workers unschedulable for {el.scale_down_after_seconds}s; "
                f"continuing with {placed} (min {el.min_replicas}) from the latest checkpoint",
                warning=True,
            )
        return
    want = min(d.job.spec.replicas, el.max_replicas) - d.replicas
    running = len(alive) == d.replicas and all(p.phase == PodPhase.RUNNING for p in alive)
    if want <= 0 or not running:
        return
    since = d.last_rescale or d.start_time or d.now
    ready_at = since + timedelta(seconds=el.scale_up_cooldown_seconds)
    if d.now < ready_at:
        d.requeue.append((ready_at - d.now).total_seconds())
        return
    d.keep_probes = True
    live = [p for p in d.probes if not p.deleting]
    if len(live) >= want and all(p.scheduled for p in live):
        old = d.replicas
        d.keep_probes = False  # capacity is proven: the probes make room for the workers
        d.next_generation(old + want)
        d.last_rescale = d.now
        d.transition(
            Phase.RESTARTING,
            "ScaledUp",
            f"capacity for {want} more workers; growing from {old} to {d.replicas} from the latest checkpoint",
        )
        return
    names = {p.name for p in live}
    d.create_probes = tuple(
        i for i in range(want) if contract.probe_pod_name(d.job.name, i) not in names
    )


def _ready_reason(st: JobState) -> tuple[str, str]:
    """Reason and message of the last decision, kept in the Ready condition."""
    for c in st.conditions:
        if c.get("type") == cond.READY:
            return str(c.get("reason") or ""), str(c.get("message") or "")
    return "", ""


def _active_phase(d: _Draft, current: Sequence[PodView]) -> None:
    """Pending -> Starting -> Running for a live generation; Restarting holds until it runs again."""
    alive = [p for p in current if not p.deleting]
    running = sum(1 for p in alive if p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED))
    ready = sum(
        1
        for p in alive
        if (p.phase == PodPhase.RUNNING and p.ready) or p.phase == PodPhase.SUCCEEDED
    )
    if len(alive) == d.replicas and running == d.replicas:
        d.transition(
            Phase.RUNNING,
            "AllWorkersRunning",
            cond.message("AllWorkersRunning", replicas=d.replicas, generation=d.generation),
        )
        return
    scheduled = sum(1 for p in alive if p.scheduled)
    phase = Phase.STARTING if alive and scheduled == d.replicas else Phase.PENDING
    stuck = [p for p in alive if p.waiting]
    if stuck:
        # Never resolves on its own (a wrong image, a missing Secret): say so, with a Warning.
        first = stuck[0]
        reason = (
            "ImagePullFailed" if first.waiting in IMAGE_PULL_REASONS else "ContainerCannotStart"
        )
        detail = (
            f"{first.waiting}: {first.waiting_message}" if first.waiting_message else first.waiting
        )
        msg = f"{len(stuck)} of {d.replicas} workers cannot start (e.g. {first.name}: {detail})"
        d.transition(
            Phase.RESTARTING if d.phase == Phase.RESTARTING else phase, reason, msg, warning=True
        )
        return
    if d.phase == Phase.RESTARTING:
        return
    unschedulable = [p for p in alive if p.unschedulable_since is not None]
    if unschedulable:
        msg = f"{len(unschedulable)} of {d.replicas} workers cannot be scheduled (e.g. {unschedulable[0].name}: {unschedulable[0].message or 'Unschedulable'})"
        d.transition(phase, "Unschedulable", msg)
    else:
        d.transition(
            phase,
            "WaitingForPods",
            cond.message("WaitingForPods", ready=ready, replicas=d.replicas),
        )


def _plan(d: _Draft, pods: Sequence[PodView], current: Sequence[PodView]) -> Plan:
    # Never delete what is being created, never delete twice.
    if not d.keep_probes:
        d.delete.extend(p.name for p in d.probes if not p.deleting)
    delete = tuple(dict.fromkeys(d.delete))
    requeue = min(d.requeue) if d.requeue else None
    return Plan(
        create=d.create,
        delete=delete,
        create_probes=d.create_probes if d.keep_probes else (),
        status=_status(d, current),
        events=tuple(d.events),
        requeue_after_s=None if requeue is None else max(requeue, 0.5),
        delete_job=d.delete_job,
        ensure_service=not (d.phase is not None and d.phase.is_terminal),
        relabel=tuple(d.relabel),
    )


def with_state(job: JobView, status: dict[str, Any]) -> JobView:
    """The job as it will look once ``status`` is written (used to step the planner in tests)."""
    return replace(job, state=JobState.from_status(status))
