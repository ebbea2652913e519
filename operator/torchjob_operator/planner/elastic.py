"""Elastic sizing: shrink to the capacity that exists, grow back once probes prove it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from torchjob import contract
from torchjob.api.models import Phase
from torchjob_operator.planner import conditions as cond
from torchjob_operator.planner.draft import Draft
from torchjob_operator.planner.observed import PodPhase, PodView


def fit_to_capacity(d: Draft, current: Sequence[PodView]) -> None:
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
                *cond.say("WaitingForCapacity", placed=placed, min=el.min_replicas),
            )
            return
        if placed < d.replicas:
            old = d.replicas
            d.next_generation(placed)
            d.last_rescale = d.now
            d.transition(
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
            Phase.RESTARTING, *cond.say("ScaledUp", want=want, old=old, replicas=d.replicas)
        )
        return
    names = {p.name for p in live}
    d.create_probes = tuple(
        i for i in range(want) if contract.probe_pod_name(d.job.name, i) not in names
    )
