"""The reconcile decision: (spec, the job's status, observed pods, clock) -> Plan.

The lifecycle lives here; the rest of the planner is split by concern:
``draft`` (the values), ``status`` (rendering the status), ``phase`` (Pending ->
Starting -> Running), ``elastic`` (shrink and grow), ``observed`` (views of pods),
``conditions`` (every reason and its message).

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
* A job Kueue manages (``planner.kueue``) runs only while its Workload is admitted: before,
  and after an eviction, it is held like a suspended one (no pods; an eviction counts as a
  disruption, never against ``maxRestarts``); an admission resumes it in a new generation.
* ``suspend`` deletes the pods and keeps the status; resuming starts a new
  generation and resets the deadline clock (as batch/v1 Job does).
* ``activeDeadlineSeconds`` counts from ``startTime``; ``plan`` asks to be
  called again when it expires, so it is enforced with nothing else happening.
* After the end, ``cleanPodPolicy`` decides which pods go, and
  ``ttlSecondsAfterFinished`` deletes the TorchJob itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from torchjob import contract
from torchjob.api.models import (
    CleanPodPolicy,
    FailureRecord,
    MembershipPolicy,
    Phase,
)
from torchjob.plan import (
    Outcome,
    Verdict,
    deadline_left,
    decide_failure,
    judge_generation,
)
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.clock import format_time
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.draft import CreatePods, Draft, JobView, Plan
from torchjob_operator.torchjob.elastic import (
    fit_to_capacity,
    in_rank_order,
    joiners,
    ready_joiners,
    replace_with_standbys,
    shrink_at_once,
    survivors_first,
    target_replicas,
)
from torchjob_operator.torchjob.kueue import Gate
from torchjob_operator.torchjob.observed import (
    JobState,
    PodPhase,
    PodView,
    ProbeView,
)
from torchjob_operator.torchjob.phase import active_phase
from torchjob_operator.torchjob.status import ready_reason, render_status

__all__ = ["CreatePods", "Event", "JobView", "Plan", "plan", "with_state"]

FOREIGN_RECHECK_S = 2.0
"""How often a job waiting for an earlier same-named job's pods looks again without a poke."""


def _finish(d: Draft, pods: Sequence[PodView], *, deadline: bool = False) -> None:
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
            d.requeue.append(min((due - d.now).total_seconds(), _MAX_REQUEUE_S))


_MAX_REQUEUE_S = 86400.0
"""A far deadline is looked at again once a day (it may be int64's maximum: a "never")."""


def _end(d: Draft, phase: Phase, reason: str, message: str) -> None:
    d.transition(phase, reason, message, warning=phase == Phase.FAILED)
    d.completion_time = d.now
    d.restart_after = None


def _survives(p: PodView) -> bool:
    """A pod worth keeping into a new generation: placed, alive, and not being taken away."""
    return p.active and p.scheduled and p.disruption is None


def _members(d: Draft, pods: Sequence[PodView]) -> list[PodView]:
    """The pods of the current generation: those labelled with it and, under KeepSurvivors,
    pods of earlier generations that survive (the plan relabels them). Everything else is
    stale and goes before new pods are created, since names and rendezvous are shared."""
    keep = d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS
    ranked = set(d.ranked)
    return [
        p
        for p in pods
        if p.index in ranked
        and (
            p.generation == d.generation or (keep and p.generation < d.generation and _survives(p))
        )
    ]


def plan(
    job: JobView, pods: Sequence[PodView], now: datetime, probes: Sequence[ProbeView] = ()
) -> Plan:
    """Decide what the job's pods and status should become. Pure; see the module docstring."""
    st, spec = job.state, job.spec
    d = Draft(
        job=job,
        now=now,
        phase=st.phase,
        generation=st.generation,
        replicas=st.replicas or spec.replicas,
        members=st.members if st.replicas else None,
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
    d.reason, d.message = ready_reason(st)

    if st.phase is not None and st.phase.is_terminal:
        _finish(d, pods)
        return _plan(d, pods, pods)

    if spec.run_policy.suspend:
        d.delete.extend(p.name for p in pods if not p.deleting)
        d.start_time = None
        d.restart_after = None
        d.transition(Phase.SUSPENDED, "Suspended", cond.message("Suspended"))
        return _plan(d, pods, [])

    gate = job.kueue
    if gate is not None and not gate.admitted:
        return _hold(d, pods, gate)

    if st.phase is None:
        d.transition(Phase.PENDING, *cond.say("WaitingForPodsCreation"))
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
        d.requeue.append(min(left, _MAX_REQUEUE_S))

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
            d.resize(spec.replicas)
    d.spec_replicas = spec.replicas

    current = _members(d, pods)
    missing: list[int] = []
    if d.created_generation == d.generation:
        have = {p.index for p in current}
        missing = [i for i in d.ranked if i not in have]
    verdict = judge_generation(current, replicas=d.replicas, missing=missing, now=now)
    if verdict.recheck_after_s is not None:
        d.requeue.append(verdict.recheck_after_s)
    stranded = _stranded_by_success(d, current, verdict.outcome)

    if stranded is not None:
        # Training ended on a member before the others could form this generation with it.
        _end(
            d,
            Phase.SUCCEEDED,
            "AllWorkersSucceeded",
            cond.message("AllWorkersSucceeded", replicas=d.replicas),
        )
        d.delete.extend(p.name for p in stranded)
        _finish(d, pods)
        return _plan(d, pods, current)
    if verdict.outcome == Outcome.SUCCEEDED:
        _end(
            d,
            Phase.SUCCEEDED,
            "AllWorkersSucceeded",
            cond.message("AllWorkersSucceeded", replicas=d.replicas),
        )
        _finish(d, pods)
        return _plan(d, pods, current)

    survivors = [p for p in current if _survives(p)]
    standbys = (
        replace_with_standbys(d, survivors, pods)
        if verdict.outcome in (Outcome.DISRUPTED, Outcome.FAILED)
        else None
    )
    if verdict.outcome == Outcome.DISRUPTED and standbys is not None:
        d.count(d.counters().disrupted(), len(standbys), standbys)
        _took_over(
            d,
            standbys,
            survivors,
            verdict.detail,
            f"disruption {d.disruptions}, the restart budget is not charged",
        )
    elif verdict.outcome == Outcome.DISRUPTED:
        smaller = shrink_at_once(d, survivors)
        if smaller is not None:
            d.count(d.counters().disrupted(), len(smaller), smaller)
        else:
            d.count(
                d.counters().disrupted(),
                spec.replicas,
                survivors_first(d, survivors, spec.replicas),
            )
        d.restart_after = None
        if smaller is not None and spec.elastic is not None:
            # Go on with the survivors now (the lost pod may still be checkpointing for its
            # grace period); its replacement joins the generation after this one.
            d.created_generation = d.generation
            d.transition(
                Phase.RESTARTING,
                *cond.say(
                    "ShrunkAfterDisruption",
                    detail=verdict.detail,
                    disruptions=d.disruptions,
                    replicas=len(smaller),
                    target=target_replicas(d),
                    min=spec.elastic.min_replicas,
                ),
                warning=True,
            )
        else:
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
        if standbys is not None:
            # Charged as any restart, but no pod is started: no backoff to wait for.
            d.count(d.counters().restarted(decision), len(standbys), standbys)
            _took_over(d, standbys, survivors, verdict.detail, decision.explanation)
        else:
            d.count(d.counters().restarted(decision), spec.replicas)
            d.restart_after = now + timedelta(seconds=decision.backoff_s)
            d.transition(Phase.RESTARTING, "WorkerFailed", text, warning=True)

    if spec.elastic is not None and verdict.outcome == Outcome.HEALTHY:
        fit_to_capacity(d, current, pods)

    # Pods of another generation (or beyond the group) go first: they share names and
    # rendezvous. Joiners (created ahead for the next generation) are neither.
    current = _members(d, pods)
    joining = joiners(d, pods)
    if spec.elastic is not None and spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS:
        d.standby_ready = len(ready_joiners(d, pods))
    stale = [p for p in pods if p not in current and p not in joining]
    d.delete.extend(p.name for p in stale if not p.deleting)
    if spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS:
        # Published with the generation, while a lost pod may still run (an evicted pod
        # checkpoints for its grace period): its runtime must not join the new generation,
        # in its successor's place or beyond the new size.
        d.replaced = sorted(p.name for p in stale)
    kept = [p for p in current if p.generation != d.generation]
    if kept:
        d.relabel = [p.name for p in kept]
        d.events.append(
            Event.of(
                "KeptSurvivors",
                generation=d.generation,
                count=len(kept),
                pods=", ".join(p.name for p in kept),
            )
        )

    waiting_backoff = d.restart_after is not None and now < d.restart_after
    if waiting_backoff and d.restart_after is not None:
        seconds = (d.restart_after - now).total_seconds()
        d.requeue.append(seconds)
        backoff = cond.message("BackoffWaiting", seconds=int(seconds + 0.999))
        d.message = f"{d.message.split('; restarting in')[0]}; {backoff}"
    elif job.foreign_pods and d.created_generation != d.generation:
        # An earlier TorchJob of this name still has pods (terminating, or not yet collected
        # by the garbage collector): ours would share their names. Wait, counting nothing;
        # their deletion pokes this job's loop (same name label), the requeue is a safety net.
        d.requeue.append(FOREIGN_RECHECK_S)
    elif not stale:
        have = {p.index for p in current}
        todo = tuple(i for i in d.ranked if i not in have)
        if todo and d.created_generation != d.generation:
            d.create = CreatePods(
                indices=todo, generation=d.generation, replicas=d.replicas, members=d.members
            )
            d.created_generation = d.generation
            d.restart_after = None
            if d.start_time is None:
                d.start_time = now
            d.events.append(Event.of("PodsCreated", replicas=len(todo), generation=d.generation))
        elif not todo and d.created_generation != d.generation:
            # Every pod exists already (an earlier operator created them and died before
            # writing the status): adopt them.
            d.created_generation = d.generation
            d.restart_after = None
            if d.start_time is None:
                d.start_time = now

    if job.foreign_pods and d.create is None and d.created_generation != d.generation:
        if d.phase != Phase.RESTARTING:
            first, count = job.foreign_pods[0], len(job.foreign_pods)
            what = f"pod {first}" if count == 1 else f"{count} pods ({first}, ...)"
            d.transition(Phase.PENDING, *cond.say("WaitingForEarlierJob", what=what, name=job.name))
    else:
        active_phase(d, current)
    return _plan(d, pods, current)


def _took_over(
    d: Draft,
    members: tuple[int, ...],
    survivors: Sequence[PodView],
    detail: str,
    counted: str,
) -> None:
    """Ready standbys took the lost pods' places in generation ``d.generation``: every pod
    of it exists (nothing to create, no backoff)."""
    d.created_generation = d.generation
    d.restart_after = None
    kept = in_rank_order(d, survivors)
    took = ", ".join(contract.worker_pod_name(d.job.name, i) for i in members if i not in kept)
    d.transition(
        Phase.RESTARTING,
        *cond.say(
            "StandbyTookOver",
            detail=detail,
            counted=counted,
            pods=took,
            generation=d.generation,
            replicas=len(members),
        ),
        warning=True,
    )


STRANDED_GRACE = timedelta(seconds=10)
"""How long the other members may take to finish after one KeepSurvivors member succeeded."""


def _stranded_by_success(
    d: Draft, current: Sequence[PodView], outcome: Outcome
) -> list[PodView] | None:
    """KeepSurvivors: the members still running ``STRANDED_GRACE`` after another member of
    the generation exited 0 (None while that is not the case).

    A pod exits 0 only once training ended (the last report is collective, rank 0 commits
    first). A generation published at the moment training ended (a grow to a joiner) can
    never form without that pod: its other members wait for a group that will not come.
    Healthy members finish within seconds of each other, so they never wait that long."""
    if outcome != Outcome.HEALTHY or d.job.spec.membership_policy != (
        MembershipPolicy.KEEP_SURVIVORS
    ):
        return None
    done = [p.finished_at for p in current if p.phase == PodPhase.SUCCEEDED]
    if not done or any(p.phase == PodPhase.FAILED for p in current):
        return None
    first = min((t for t in done if t is not None), default=d.now)
    due = first + STRANDED_GRACE
    if d.now < due:
        d.requeue.append((due - d.now).total_seconds())
        return None
    return [p for p in current if p.active]


def _hold(d: Draft, pods: Sequence[PodView], gate: Gate) -> Plan:
    """Kueue has not admitted the job, or evicted it: no pod runs (deleted gracefully, so
    the workers checkpoint on SIGTERM) and the job waits suspended. An eviction of a job
    that had pods is a disruption, never a restart: it is counted once, when it happens."""
    d.delete.extend(p.name for p in pods if not p.deleting)
    d.start_time = None
    d.restart_after = None
    if gate.evicted is not None:
        if d.phase not in (None, Phase.SUSPENDED) and d.created_generation is not None:
            d.disruptions += 1
        d.transition(
            Phase.SUSPENDED,
            "AdmissionEvicted",
            cond.message("AdmissionEvicted", workload=gate.workload, detail=gate.evicted),
            warning=True,
        )
    else:
        d.transition(
            Phase.SUSPENDED,
            "WaitingForAdmission",
            cond.message("WaitingForAdmission", workload=gate.workload, queue=gate.queue),
        )
    return _plan(d, pods, [])


def _plan(d: Draft, pods: Sequence[PodView], current: Sequence[PodView]) -> Plan:
    # Never delete what is being created, never delete twice.
    if not d.keep_probes:
        d.delete.extend(p.name for p in d.probes if not p.deleting)
    delete = tuple(dict.fromkeys(d.delete))
    requeue = min(d.requeue) if d.requeue else None
    # The status never counts a pod this plan deletes: it is written before they go.
    doomed = set(delete)
    return Plan(
        create=d.create,
        delete=delete,
        create_probes=d.create_probes if d.keep_probes else (),
        status=render_status(d, [p for p in current if p.name not in doomed]),
        events=tuple(d.events),
        requeue_after_s=None if requeue is None else max(requeue, 0.5),
        delete_job=d.delete_job,
        # With the pods it serves: a running job's reconcile never POSTs it again (that was
        # a third of the operator's idle requests, each answered 409 AlreadyExists).
        ensure_service=d.create is not None,
        relabel=tuple(d.relabel),
    )


def with_state(job: JobView, status: dict[str, Any]) -> JobView:
    """The job as it will look once ``status`` is written (used to step the planner in tests)."""
    return replace(job, state=JobState.from_status(status))
