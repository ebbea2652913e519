"""Elastic sizing in pod terms: which pods an elastic job goes on with, and which it adds.

The rules are ``torchjob.rules``'s, the ones every launcher applies: the job's
``spec.elastic`` as ``ElasticRules`` (:func:`elastic_rules`); whether a loss shrinks the
group is ``decide_restart``'s (``operator/.../torchjob/loss.py`` calls it), when a shrunk
group grows back is ``rules.resize.grow_back``'s. This module chooses the pod indices.

Under ``membershipPolicy: KeepSurvivors`` a lost pod costs no waiting: the job goes on at
once with the pods that survive (in their rank order, :func:`in_rank_order`), the
replacement is created as soon as its name is free, for the *next* generation (a *joiner*:
it starts, imports torch and waits for that generation to be published), and the job grows
back to it at a step boundary once it runs (``grow_with_joiners``). Capacity probes are not
needed there: a joiner that cannot be placed just stays Pending, as a probe would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from torchjob import contract
from torchjob.api.models import MembershipPolicy, Phase
from torchjob.rules.loss import ElasticRules
from torchjob.rules.resize import Resize, grow_back
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.decision import CreatePods, Decision
from torchjob_operator.torchjob.joining import former_member, join_order, left_out, outlives
from torchjob_operator.torchjob.observed import PodPhase, PodView
from torchjob_operator.torchjob.topology import (
    Assignment,
    domain_key,
    in_topology_order,
    place,
)


def target_replicas(d: Decision) -> int:
    """The size an elastic job grows back to: ``spec.replicas`` within ``maxReplicas``."""
    el = d.job.spec.elastic
    assert el is not None
    return min(d.job.spec.replicas, el.max_replicas)


def in_rank_order(d: Decision, survivors: Sequence[PodView]) -> tuple[int, ...]:
    """The survivors' pod indices in the current generation's rank order."""
    alive = {p.index for p in survivors}
    return tuple(i for i in d.ranked if i in alive)


def elastic_rules(d: Decision) -> ElasticRules | None:
    """The job's ``spec.elastic`` as the job rules' ``ElasticRules`` (None: not elastic).

    A loss shrinks the group only under ``KeepSurvivors`` with ``shrinkOnDisruption``, and
    only once the generation was created (the survivors must exist): the survivors keep
    their rank order and the first becomes rank 0 (the rendezvous moves to it,
    ``status.members``), so losing pod 0 costs what losing any other pod costs. The grow-back
    cooldown is ``scaleUpCooldownSeconds``; a KeepSurvivors group re-forms in place from its
    memory, so it needs no checkpoint to grow back; a ``RecreateGroup`` job with
    ``spec.checkpoint`` restarts every pod from storage, so it grows back only once its
    generation committed one (``status.progress.checkpointGeneration``, rank 0's report).
    """
    el = d.job.spec.elastic
    if el is None:
        return None
    keep = d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS
    return ElasticRules(
        floor=el.min_replicas,
        ceiling=target_replicas(d),
        grow_cooldown_s=el.scale_up_cooldown_seconds,
        checkpoint_before_grow=not keep and d.job.spec.checkpoint is not None,
        shrink_on_loss=el.shrink_on_disruption and keep and d.created_generation == d.generation,
    )


def _assignment(d: Decision) -> Assignment | None:
    """The admission's topology assignment (Kueue TAS), if the job has one."""
    return d.job.kueue.topology if d.job.kueue is not None else None


def along_topology(
    d: Decision,
    members: tuple[int, ...],
    pods: Sequence[PodView],
    planned: Mapping[int, str] | None = None,
) -> tuple[int, ...]:
    """``members`` (lead first) in the rank order of the admission's topology
    (``topology.in_topology_order``); unchanged without one. ``planned``: the domain of each
    pod created in this pass (``topology.place``, as the pod's body will get it)."""
    assigned = _assignment(d)
    if assigned is None:
        return members
    domain_of = {p.index: p.domain for p in pods if p.domain} | dict(planned or {})
    return in_topology_order(assigned, members, domain_of)


def holds_its_name(p: PodView) -> bool:
    """A lost pod whose deletion will not be confirmed soon: its peers found it silent (its
    node may have vanished while the API server still shows it Ready), or its node is known
    lost (it stays Terminating there). Its index is not given to a new pod."""
    return p.silent is not None or p.node_lost


def survivors_first(
    d: Decision, survivors: Sequence[PodView], replicas: int, pods: Sequence[PodView] = ()
) -> tuple[int, ...] | None:
    """KeepSurvivors, replaced at full size: the first survivor leads (so rank 0 and the
    rendezvous stay on a pod that runs, whose DNS name resolves, and the newcomers join it),
    the others and the new pods follow the topology (:func:`along_topology`: each new pod
    where ``topology.place`` will put it). ``None`` (pods ``0..replicas-1``) for
    ``RecreateGroup``.

    The places are taken by the joiners that are starting (:func:`joiners`), then by new
    pods, which never take the index of a pod in ``pods`` that :func:`holds_its_name`: the
    survivors read the rank order the moment it is published, so it must name the pods that
    will be created. Chosen as a lost pod's index and rewritten at the next pass (its name
    still held), the order the survivors had read named the lost pods in two of the new
    ranks, and their silent reports named the lost pods instead of the new ones when that
    node went too (bench/results/2026-11-29h run 2, loss 3: two pods of a vanished node left
    one generation, 23 s, later)."""
    if d.job.spec.membership_policy != MembershipPolicy.KEEP_SURVIVORS:
        return None
    kept = in_rank_order(d, survivors)[:replicas]
    # Replacements already starting (a grow's joiners) take places first: a new pod starts
    # from nothing (two joiners 35 s into their start were deleted for four new pods). Those
    # on a node first: the group waited 38 s for four no node took while four ran on a node
    # noticed with 100 s left (bench/results/2026-12-05t notice120-0, generation 10).
    starting = [p for p in joiners(d, pods) if not holds_its_name(p)]
    waiting = tuple(p.index for p in sorted(starting, key=lambda p: not p.scheduled))
    held = set(kept) | set(waiting)
    held |= {p.index for p in pods if holds_its_name(p) and p not in survivors}
    fresh = (i for i in range(replicas + len(held)) if i not in held)
    fill = (*waiting, *fresh)[: replicas - len(kept)]
    planned: dict[int, str] = {}
    assigned = _assignment(d)
    if assigned is not None and fill:
        taken = [p.domain for p in survivors if p.domain]
        planned = {i: domain_key(v) for i, v in place(assigned, fill, taken).items()}
    return along_topology(d, kept + fill, survivors, planned)


def joiner_room(d: Decision, pods: Sequence[PodView]) -> int:
    """How many joiners the job keeps: the places of members that are gone or going (below the
    target size, or given notice), plus ``standbyReplicas``. A member that finished training
    (exit 0) keeps its place: the others finish a moment later, nobody takes it over. One
    whose notice is longer than the job's replacement lead (``d.replace_later``) keeps it
    until its replacement is due, unless one was made already (the lead falls when the pod
    whose start was slowest goes): a joiner is never undone."""
    ranked, later = set(d.ranked), {i for i, _ in d.replace_later}
    staying = [p for p in pods if p.index in ranked and _stays(p)]
    room = max(target_replicas(d) - len(staying), 0) + d.job.spec.standby_replicas
    waits = sum(1 for p in pods if p.index in later & ranked and p not in staying)
    return max(room - waits, min(room, len(_waiting(d, pods)))) if waits else room


def _stays(p: PodView) -> bool:
    """Finished training, or runs with no disruption and no notice."""
    return p.phase == PodPhase.SUCCEEDED or (
        p.active and p.disruption is None and p.notice_until is None
    )


def _waiting(d: Decision, pods: Sequence[PodView]) -> list[PodView]:
    """Pods of the job that wait to join a later generation (``joiners`` before its cap), those
    on nodes given notice last: the cap and a generation's places go to the others first. One
    whose node goes too soon (``joining.outlives``) waits for nothing: it is stale."""
    ranked, later, left = set(d.ranked), d.generation + 1, left_out(d)
    up = (p for p in pods if p.index not in ranked and (p.joiner or p.generation == later))
    up = (p for p in up if p.active and outlives(p, d.now) and not former_member(p, left))
    return sorted(up, key=join_order)


def joiners(d: Decision, pods: Sequence[PodView]) -> list[PodView]:
    """Pods created ahead of the generation that takes them in (``contract.LABEL_JOINER``;
    an older operator's: labelled ``generation + 1``): replacements and warm standbys, still
    running or about to, by index, as many as ``joiner_room``. Not members yet, not stale
    either. One that ended (it failed, or was taken away), or one beyond the room (the job
    was scaled down, or has fewer standbys now), is stale and goes."""
    if d.job.spec.elastic is None or d.job.spec.membership_policy != (
        MembershipPolicy.KEEP_SURVIVORS
    ):
        return []
    return _waiting(d, pods)[: joiner_room(d, pods)]


def ready_joiners(d: Decision, pods: Sequence[PodView]) -> list[PodView]:
    """Joiners whose runtime waits to join (their readiness probe), in ``join_order``."""
    return [p for p in joiners(d, pods) if p.phase == PodPhase.RUNNING and p.ready and p.scheduled]


def replace_with_standbys(
    d: Decision, survivors: Sequence[PodView], pods: Sequence[PodView]
) -> tuple[int, ...] | None:
    """After a loss: the next generation at full size right away, the survivors first and
    ready joiners (warm standbys) in the lost pods' places; None when too few are ready.
    Nothing is started: the survivors and the standbys re-form the group in their processes."""
    el = d.job.spec.elastic
    if (
        el is None
        or d.job.spec.membership_policy != MembershipPolicy.KEEP_SURVIVORS
        or d.created_generation != d.generation
    ):
        return None
    kept = in_rank_order(d, survivors)
    need = target_replicas(d) - len(kept)
    ready = [p.index for p in ready_joiners(d, pods) if p.index not in kept]
    if need <= 0 or len(ready) < need:
        return None
    return along_topology(d, kept + tuple(ready[:need]), pods)


def _grows(d: Decision, *, proven: bool, since: datetime | None = None) -> bool:
    """The job rules' grow-back decision (``rules.resize.grow_back``) for a job whose joiners
    or probes ``proven`` room for the full size; the cooldown counts from ``since`` (default:
    the last capacity rescale; none yet: no cooldown)."""
    rules = elastic_rules(d)
    assert rules is not None
    start = since or d.last_rescale
    age = math.inf if start is None else (d.now - start).total_seconds()
    top = target_replicas(d)
    decided = grow_back(
        rules,
        num_workers=d.replicas,
        available_workers=top if proven else d.replicas,
        checkpoints_in_generation=d.checkpoints_in_generation,
        generation_age_s=age,
    )
    return isinstance(decided, Resize)


def _leaving(d: Decision, pods: Sequence[PodView]) -> str:
    """The members given notice, each with why: ``w-1 (node n3: <taint key>, 112 s left)``
    for a node's termination notice, ``w-1 (evicted, 50 s left)`` for its own eviction."""
    by_index = {p.index: p for p in pods if p.index in d.leaving}
    out = []
    for i in d.leaving:
        name = contract.worker_pod_name(d.job.name, i)
        p = by_index.get(i)
        until = None if p is None else (p.deletion_at if p.deleting else p.notice_until)
        left = "" if until is None else f", {max((until - d.now).total_seconds(), 0):.0f} s left"
        if p is not None and p.notice is not None:
            out.append(f"{name} (node {p.node}: {p.notice}{left})")
        elif p is not None and p.deleting:
            out.append(f"{name} ({p.disruption or 'deleted'}{left})")
        else:
            out.append(name)
    return ", ".join(out)


def grow_with_joiners(d: Decision, current: Sequence[PodView], pods: Sequence[PodView]) -> Decision:
    """KeepSurvivors: keep ``joiner_room`` joiners (``target - replicas``, the places of
    members given notice, and ``standbyReplicas`` standbys), created at once under free pod
    indices; once enough joiners wait to join, publish
    generation g+1 at the full size (the survivors stop at their next report and re-form the
    group with the joiners), and the other joiners stay as standbys.

    ``scaleUpCooldownSeconds`` counts from the last capacity-driven rescale (``ScaledDown`` /
    ``ScaledUp``); a shrink after a disruption sets none, so the replacement joins at once.
    Standbys are created regardless of it.
    """
    el = d.job.spec.elastic
    assert el is not None
    top = target_replicas(d)
    want = top - d.replicas
    standby = d.job.spec.standby_replicas
    alive = [p for p in current if not p.deleting]
    running = len(alive) == d.replicas and all(p.phase == PodPhase.RUNNING for p in alive)
    room = joiner_room(d, pods)
    if want <= 0 and room == 0:
        return d
    cooling = False
    if want > 0 and d.last_rescale is not None:
        ready_at = d.last_rescale + timedelta(seconds=el.scale_up_cooldown_seconds)
        if d.now < ready_at:
            d = d.also(requeue=[(ready_at - d.now).total_seconds()])
            cooling = True
    if want > 0 and not running and standby == 0:
        return d
    joining = joiners(d, pods)
    ready = ready_joiners(d, pods)
    if want > 0 and running and _grows(d, proven=len(ready) >= want):
        old = d.replicas
        grown = d.ranked + tuple(p.index for p in ready[:want])
        d = d.next_generation(top, along_topology(d, grown, pods))
        # Every pod of the new generation exists: nothing to create.
        return d.but(created_generation=d.generation).transition(
            Phase.RESTARTING, *cond.say("ScaledUp", want=want, old=old, replicas=top)
        )
    if want > 0 and cooling and standby == 0:
        return d
    missing = room - len(joining)
    if missing <= 0:
        return d
    # The lowest indices whose names are free: a pod being deleted holds its name for its
    # grace period, so a replacement is created under another index rather than after it.
    taken = {p.index for p in pods} | set(d.ranked)
    free = tuple(i for i in range(len(taken) + missing) if i not in taken)[:missing]
    grown = d.ranked + tuple(sorted({p.index for p in joining} | set(free)))[: max(want, 0)]
    create = CreatePods(
        indices=free,
        generation=d.generation + 1,
        replicas=len(grown) if want > 0 else top,
        joiners=True,
        members=None if want <= 0 or grown == tuple(range(len(grown))) else grown,
        avoid=d.move.keep_off if d.move is not None else (),
    )
    names = ", ".join(contract.worker_pod_name(d.job.name, i) for i in free)
    joined = [Event.of("CreatedJoiner", pods=names, generation=d.generation + 1)]
    if d.move is not None:
        m = d.move
        joined.append(
            Event.of(
                "Rebalancing",
                counts=", ".join(f"{n} {c}" for n, c in m.counts),
                leaving=", ".join(
                    f"{contract.worker_pod_name(d.job.name, i)} ({a} -> {b})" for i, a, b in m.moves
                ),
                pods=names,
                keep_off=", ".join(m.keep_off),
            )
        )
    elif d.leaving:
        joined.append(Event.of("ReplacingBeforeLeaving", leaving=_leaving(d, pods), pods=names))
    return d.but(create=create).also(events=joined)


def fit_to_capacity(
    d: Decision, current: Sequence[PodView], pods: Sequence[PodView] | None = None
) -> Decision:
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
        return d
    alive = [p for p in current if not p.deleting]
    placed = sum(1 for p in alive if p.scheduled)
    waiting = [p for p in alive if p.unschedulable_since is not None]
    if waiting:
        first = min(p.unschedulable_since for p in waiting if p.unschedulable_since)
        due = first + timedelta(seconds=el.scale_down_after_seconds)
        if d.now < due:
            return d.also(requeue=[(due - d.now).total_seconds()])
        if placed < el.min_replicas:
            return d.transition(
                Phase.PENDING,
                *cond.say("WaitingForCapacity", placed=placed, min=el.min_replicas),
            )
        if placed >= d.replicas:
            return d
        old = d.replicas
        on_nodes = {p.index for p in alive if p.scheduled}
        keep = d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS
        # KeepSurvivors goes on with the placed pods themselves; RecreateGroup makes new ones.
        d = d.next_generation(placed, tuple(i for i in d.ranked if i in on_nodes) if keep else None)
        return d.but(last_rescale=d.now).transition(
            Phase.RESTARTING,
            *cond.say(
                "ScaledDown",
                lost=old - placed,
                old=old,
                after=el.scale_down_after_seconds,
                placed=placed,
                min=el.min_replicas,
            ),
            warning=True,
        )
    if d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS:
        return grow_with_joiners(d, current, current if pods is None else pods)
    want = target_replicas(d) - d.replicas
    running = len(alive) == d.replicas and all(p.phase == PodPhase.RUNNING for p in alive)
    if want <= 0 or not running:
        return d
    since = d.last_rescale or d.start_time or d.now
    ready_at = since + timedelta(seconds=el.scale_up_cooldown_seconds)
    if d.now < ready_at:
        return d.also(requeue=[(ready_at - d.now).total_seconds()])
    live = [p for p in d.probes if not p.deleting]
    if _grows(d, proven=len(live) >= want and all(p.scheduled for p in live), since=since):
        old = d.replicas
        # Capacity is proven: the probes go (keep_probes stays False) to make room.
        d = d.next_generation(old + want)
        return d.but(last_rescale=d.now).transition(
            Phase.RESTARTING, *cond.say("ScaledUp", want=want, old=old, replicas=d.replicas)
        )
    names = {p.name for p in live}
    return d.but(
        keep_probes=True,
        create_probes=tuple(
            i for i in range(want) if contract.probe_pod_name(d.job.name, i) not in names
        ),
    )
