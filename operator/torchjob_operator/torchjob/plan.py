"""The reconcile decision: (spec, the job's status, observed pods, clock) -> Plan.

The lifecycle lives here; the rest of the planner is split by concern:
``decision`` (the values: ``JobView`` in, the immutable ``Decision`` while deciding, ``Plan``
out), ``loss`` (after a failure or a disruption), ``ending`` (success, failure, clean-up,
the hold while Kueue has not admitted the job), ``status`` (rendering the status), ``phase``
(Pending -> Starting -> Running), ``elastic`` (shrink and grow), ``observed`` (views of
pods), ``common.conditions`` (every reason and its message). Decisions that depend on what
a write answered are ``amend``'s.

``plan`` is the Kubernetes view over the shared decisions in ``torchjob.rules``
(judgement, failure verdict, counters, deadline) and does no I/O:
``controller`` reads the world (``observe``), calls it, and carries the plan out
(``act``: creates, then one status patch, then relabels and deletes, then Events).
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
  ``maxRestarts``. An elastic ``KeepSurvivors`` job with ``replaceBeforeLeaving`` first
  lets a pod given notice train on through its grace period while its replacement
  starts, and then swaps the two in one generation (``drain``).
* A job Kueue manages (``torchjob.kueue``) runs only while its Workload is admitted: before,
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

from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from torchjob.api.models import MembershipPolicy, Phase
from torchjob.rules import Outcome, deadline_left, judge_generation
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob import history
from torchjob_operator.torchjob.broken import reform_broken
from torchjob_operator.torchjob.decision import CreatePods, Decision, JobView, Plan
from torchjob_operator.torchjob.drain import draining, kept_after_loss, taken, waited_for
from torchjob_operator.torchjob.elastic import fit_to_capacity, joiners, ready_joiners
from torchjob_operator.torchjob.ending import (
    MAX_REQUEUE_S,
    end,
    finish,
    hold,
    stranded_by_success,
    succeed,
    suspend,
)
from torchjob_operator.torchjob.initializing import holds, initializing
from torchjob_operator.torchjob.joining import outlives
from torchjob_operator.torchjob.loss import after_loss, survives
from torchjob_operator.torchjob.nodes import held_only, overdue_in, place_again, placed_again
from torchjob_operator.torchjob.observed import JobState, PodView, ProbeView
from torchjob_operator.torchjob.phase import active_phase
from torchjob_operator.torchjob.silent import pod_nodes, recheck_after, silenced
from torchjob_operator.torchjob.spread import spread_back
from torchjob_operator.torchjob.status import ready_reason, render_status

__all__ = ["CreatePods", "Event", "JobView", "Plan", "plan", "with_state"]

FOREIGN_RECHECK_S = 2.0
"""How often a job waiting for an earlier same-named job's pods looks again without a poke."""


def _members(d: Decision, pods: Sequence[PodView]) -> list[PodView]:
    """The pods of the current generation: those labelled with it and, under KeepSurvivors,
    pods of earlier generations that survive (the plan relabels them). Everything else is
    stale and goes before new pods are created, since names and rendezvous are shared.

    A pod on a noticed node survives into a later generation only while it trains on as a
    leaver (``d.leaving``, a grow during its notice); once taken (``drain.taken``: its node
    is going) it never does. Counted as one, a pod whose index the new generation reuses (a
    full-size replacement when every member was on the node) was kept, judged taken again at
    the next pass, and each pass published a generation and counted a disruption: 54 in 28 s
    in bench/results/2026-11-29g's 30 s notice row, until the node vanished."""
    keep = d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS
    ranked = set(d.ranked)
    return [
        p
        for p in pods
        if p.index in ranked
        and (
            p.generation == d.generation
            or (keep and p.generation < d.generation and survives(p) and _not_taken(d, p))
        )
    ]


def _not_taken(d: Decision, p: PodView) -> bool:
    """Not on a noticed node, or a leaver that trains on (``drain.draining``), or kept by the
    pass that published this generation with its pods (``created_generation``: a hand-over,
    a shrink, a grow), its relabel not seen yet. Dropped as taken when its node was noticed in
    that moment, every kept member of a hand-over left at once and the job restarted from
    storage instead of draining them (bench/results/2026-12-05f, +150 s and +442 s). Nor is
    a pod placed with time left on its node (``joining.outlives``) in a generation still to
    create: dropped, four pods starting on a node with 90 s left went as stale, the four kept
    beside them were taken next, and the job restarted from storage with pods no node could
    take (2026-12-05r notice120-0: 66.6 s without a step). Pods taken stay out."""
    return outlives(p, d.now) or p.index in d.leaving or d.created_generation == d.generation


def _start(job: JobView, now: datetime, probes: Sequence[ProbeView]) -> Decision:
    """The decision before anything is decided: the job as its status left it."""
    st, spec = job.state, job.spec
    reason, message = ready_reason(st)
    return Decision(
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
        placing_again=st.placing_again,
        spec_replicas=st.spec_replicas,
        last_rescale=st.last_rescale,
        probes=tuple(probes),
        reason=reason,
        message=message,
    )


def _rescale(d: Decision) -> Decision:
    """A user's scale (spec.replicas changed) always starts a generation of the new size. An
    elastic job may run below spec.replicas after a shrink; that is not a scale request."""
    spec = d.job.spec
    user_scaled = d.spec_replicas is not None and d.spec_replicas != spec.replicas
    if spec.replicas != d.replicas and (user_scaled or spec.elastic is None):
        if d.created_generation == d.generation:
            old = d.replicas
            d = d.next_generation(spec.replicas).but(restart_after=None)
            d = d.transition(
                Phase.RESTARTING,
                "Rescaled",
                cond.message("Rescaled", old=old, replicas=d.replicas, generation=d.generation),
            )
        else:  # nothing created for this generation yet: just adopt the new size
            d = d.resize(spec.replicas)
    return d.but(spec_replicas=spec.replicas)


def plan(
    job: JobView, pods: Sequence[PodView], now: datetime, probes: Sequence[ProbeView] = ()
) -> Plan:
    """Decide what the job's pods and status should become. Pure; see the module docstring."""
    st, spec = job.state, job.spec
    d = _start(job, now, probes)

    if st.phase is not None and st.phase.is_terminal:
        return _plan(finish(d, pods), pods, pods)
    if spec.run_policy.suspend:
        return _plan(suspend(d, pods), pods, [])
    gate = job.kueue
    if gate is not None and not gate.admitted:
        return _plan(hold(d, pods, gate), pods, [])
    init = job.initializers
    if init is not None and holds(d, init):  # no worker before every initialiser succeeded
        return _plan(initializing(d, pods, init), pods, [])

    if st.phase is None:
        d = d.transition(Phase.PENDING, *cond.say("WaitingForPodsCreation"))
    elif st.phase == Phase.SUSPENDED:
        d = d.next_generation(spec.replicas)
        d = d.transition(Phase.PENDING, "Resumed", cond.message("Resumed"))

    deadline = spec.run_policy.active_deadline_seconds
    left = deadline_left(deadline, d.start_time, now)
    if left is not None:
        if left <= 0:
            d = end(
                d,
                Phase.FAILED,
                "DeadlineExceeded",
                cond.message("DeadlineExceeded", deadline=deadline),
            )
            return _plan(finish(d, pods, deadline=True), pods, pods)
        d = d.also(requeue=[min(left, MAX_REQUEUE_S)])

    d = _rescale(d)
    # Pods the survivors saw go silent are lost like SIGKILLed ones (torchjob/silent.py).
    on = pod_nodes(pods)
    pods = silenced(pods, st.silent, d.generation, d.ranked, job.name, st.history, now, st.broken)
    wait = recheck_after(st.silent, d.generation, d.ranked, job.name, st.history, now, on)
    d = d.also(requeue=[wait] if wait is not None else [])
    current = _members(d, pods)
    # A job its losses crowded onto few nodes moves one member at a time (torchjob/spread.py):
    # given notice here, it is drained like any member given notice.
    d, pods = spread_back(d, current, pods)
    current = _members(d, pods)
    # A pod kept off nodes that are fine again, and so unschedulable, is made again.
    d = place_again(d, pods)
    current = [p for p in current if not placed_again(d, p)]
    missing: list[int] = []
    if d.created_generation == d.generation:
        have = {p.index for p in current}
        missing = [i for i in d.ranked if i not in have and i not in d.placing_again]
    # A member given notice trains on while its replacement starts (torchjob/drain.py).
    d, judged = draining(d, current, pods)
    verdict = judge_generation(judged, replicas=d.replicas, missing=missing, now=now)
    if verdict.recheck_after_s is not None:
        d = d.also(requeue=[verdict.recheck_after_s])
    d, stranded = stranded_by_success(d, current, verdict.outcome)
    if stranded is not None:
        # Training ended on a member before the others could form this generation with it.
        return _plan(succeed(d, pods, stranded), pods, current)
    if verdict.outcome == Outcome.SUCCEEDED:
        return _plan(succeed(d, pods), pods, current)
    d, ended = after_loss(d, verdict, taken(current, kept_after_loss(d, current)), pods)
    if ended:
        return _plan(d, pods, current)
    if verdict.outcome == Outcome.HEALTHY and wait is None and (r := reform_broken(d, current)):
        d = r  # every member's group broke, none lost, no report waits (torchjob/broken.py)
        if d.phase is not None and d.phase.is_terminal:  # it broke again: budget spent
            return _plan(finish(d, pods), pods, current)
    elif spec.elastic is not None and verdict.outcome == Outcome.HEALTHY:
        staying = [p for p in current if p.index not in d.placing_again]
        d = fit_to_capacity(d, staying, pods)
    return _carry_on(d, pods)


def _carry_on(d: Decision, pods: Sequence[PodView]) -> Plan:
    """The generation goes on: stale pods go, kept ones are relabelled, missing ones are
    created (after the backoff, once an earlier same-named job's pods are gone)."""
    job, spec, now = d.job, d.job.spec, d.now
    # Pods of another generation (or beyond the group) go first: they share names and
    # rendezvous. Joiners (created ahead for the next generation) are neither.
    current = _members(d, pods)
    joining = joiners(d, pods)
    if spec.elastic is not None and spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS:
        d = d.but(standby_ready=len(ready_joiners(d, pods)))
    stale = [p for p in pods if p not in current and p not in joining]
    d = d.also(delete=[p.name for p in stale if not p.deleting])
    if spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS:
        # Published with the generation, while a lost pod may still run (an evicted pod
        # checkpoints for its grace period): its runtime must not join the new generation,
        # in its successor's place or beyond the new size.
        d = d.but(replaced=tuple(sorted(p.name for p in stale)))
    kept = [p for p in current if p.generation != d.generation]
    if kept:
        d = d.but(relabel=tuple(p.name for p in kept)).also(
            events=[
                Event.of(
                    "KeptSurvivors",
                    generation=d.generation,
                    count=len(kept),
                    pods=", ".join(p.name for p in kept),
                )
            ]
        )

    if d.restart_after is not None and now < d.restart_after:
        seconds = (d.restart_after - now).total_seconds()
        backoff = cond.message("BackoffWaiting", seconds=int(seconds + 0.999))
        d = d.also(requeue=[seconds]).but(waiting=backoff)
    elif job.foreign_pods and d.created_generation != d.generation:
        # An earlier TorchJob of this name still has pods (terminating, or not yet collected
        # by the garbage collector): ours would share their names. Wait, counting nothing;
        # their deletion pokes this job's loop (same name label), the requeue is a safety net.
        d = d.also(requeue=[FOREIGN_RECHECK_S])
    elif not (waits := waited_for(d, stale, current)) or _all_there(d, current):
        # A pod stuck Terminating on a lost node, deleted after its peers found it silent
        # (its node may have vanished while the API server still shows it Ready), or overdue,
        # blocks nothing: only its index is taken; nor, for KeepSurvivors, does a pod being
        # deleted whose name no missing place needs.
        held = {p.index for p in stale if held_only(p, now)}
        d = _create(d, current, held, {p.index for p in pods})
    else:  # look again once a pod waited for would be overdue (nothing else may say so)
        d = d.also(requeue=overdue_in(waits, now))

    if job.foreign_pods and d.create is None and d.created_generation != d.generation:
        if d.phase != Phase.RESTARTING:
            first, count = job.foreign_pods[0], len(job.foreign_pods)
            what = f"pod {first}" if count == 1 else f"{count} pods ({first}, ...)"
            d = d.transition(
                Phase.PENDING, *cond.say("WaitingForEarlierJob", what=what, name=job.name)
            )
    else:
        d = active_phase(d, current)
    return _plan(d, pods, current)


def _all_there(d: Decision, current: Sequence[PodView]) -> bool:
    """Every place of a generation not yet counted created has its pod (joiners that took
    them): nothing is created, so no stale pod's name or checkpoint is waited for. Waiting,
    the generation never counted itself created and could not drain: a notice on its
    members' node 20 s after it began restarted the job at once (bench/results/2026-12-05g,
    +442 s: the leavers it replaced, deleted on a noticed node, still had a second left)."""
    have = {p.index for p in current}
    return d.created_generation != d.generation and all(i in have for i in d.ranked)


def _create(
    d: Decision,
    current: Sequence[PodView],
    stuck: Collection[int] = frozenset(),
    occupied: Collection[int] = frozenset(),
) -> Decision:
    """The current generation's missing pods, once nothing stale is left but pods stuck on a
    lost node; or, when every pod exists already (an earlier operator created them and died
    before writing the status), their adoption. A missing place whose index a ``stuck`` pod
    still holds is created under the lowest index no pod holds (``occupied``) instead, and
    the generation's rank order (``members``) says so."""
    have = {p.index for p in current}
    if d.created_generation == d.generation:
        return _create_again(d, have)
    held = (set(stuck) - have) & set(d.ranked)
    if held:
        busy = set(occupied) | set(d.ranked)
        free = iter(i for i in range(len(busy) + d.replicas + 1) if i not in busy)
        d = d.resize(d.replicas, tuple(next(free) if i in held else i for i in d.ranked))
    todo = tuple(i for i in d.ranked if i not in have)
    d = d.but(
        created_generation=d.generation,
        restart_after=None,
        start_time=d.now if d.start_time is None else d.start_time,
    )
    return _creating(d, todo)


def _create_again(d: Decision, have: Collection[int]) -> Decision:
    """The members ``place_again`` deleted, once gone: in the same generation, as they were."""
    todo = tuple(i for i in d.ranked if i in d.placing_again and i not in have)
    left = tuple(i for i in d.placing_again if i in d.ranked and i not in todo)
    return _creating(d.but(placing_again=left), todo)


def _creating(d: Decision, todo: tuple[int, ...]) -> Decision:
    """The current generation's pods ``todo`` created (nothing when empty), with the Event."""
    if not todo:
        return d
    create = CreatePods(
        indices=todo, generation=d.generation, replicas=d.replicas, members=d.members
    )
    created = Event.of("PodsCreated", replicas=len(todo), generation=d.generation)
    return d.but(create=create).also(events=[created])


def _plan(d: Decision, pods: Sequence[PodView], current: Sequence[PodView]) -> Plan:
    # Never delete what is being created, never delete twice.
    if not d.keep_probes:
        d = d.also(delete=[p.name for p in d.probes if not p.deleting])
    delete = tuple(dict.fromkeys(d.delete))
    requeue = min(d.requeue) if d.requeue else None
    # The status never counts a pod this plan deletes: it is written before they go.
    doomed = set(delete)
    records, losses, told = history.advance(d, pods)
    return Plan(
        create=d.create,
        delete=delete,
        create_probes=d.create_probes if d.keep_probes else (),
        status=render_status(d, [p for p in current if p.name not in doomed], records, losses),
        events=(*d.events, *told),
        requeue_after_s=None if requeue is None else max(requeue, 0.5),
        delete_job=d.delete_job,
        # With the pods it serves: a running job's reconcile never POSTs it again (that was
        # a third of the operator's idle requests, each answered 409 AlreadyExists).
        ensure_service=d.create is not None,
        relabel=d.relabel,
        initialize=d.initialize,
    )


def with_state(job: JobView, status: dict[str, Any]) -> JobView:
    """The job as it will look once ``status`` is written (used to step the planner in tests)."""
    return replace(job, state=JobState.from_status(status))
