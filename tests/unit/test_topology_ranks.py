"""Ranks follow the topology after a re-formation (issue 42 item 3): a KeepSurvivors job that
lost a pod and grew back to its replacement keeps each domain's pods contiguous in rank, the
replacement beside its rack's survivors rather than last (torchjob/topology.py
``in_topology_order``, applied by torchjob/elastic.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.builders import at, job, running
from tests.unit.test_kueue_planner import ADMITTED, gated
from tests.unit.test_planner import apply, evicted
from tests.unit.test_topology_decisions import BLOCK, _assignment

from torchjob import contract
from torchjob.api.models import TorchJobSpec
from torchjob_operator.torchjob import topology
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import JobView, with_state
from torchjob_operator.torchjob.writes import decide

THREE_RACKS = {"rack1": 2, "rack2": 2, "rack3": 2}


def _assigned() -> topology.Assignment:
    ta = topology.assignment_of(_assignment(THREE_RACKS))
    assert ta is not None
    return ta


def _rack_crossings(order: tuple[int, ...], rack: dict[int, str]) -> int:
    """How often a ring over ``order`` crosses from one rack to another (wrapping around)."""
    return sum(rack[a] != rack[b] for a, b in zip(order, order[1:] + order[:1], strict=True))


def test_the_replacement_goes_beside_its_racks_survivors_and_the_lead_keeps_rank_0() -> None:
    ta = _assigned()
    key = [topology.domain_key(d.values) for d in ta.domains]
    rack = {i: ta.domains[i].values[1] for i in range(6)}
    # Pod 2 (rack2) was lost; its replacement, pod 6, was placed in pod 2's domain.
    domain_of = {i: key[i] for i in (0, 1, 3, 4, 5)} | {6: key[2]}
    rack[6] = rack[2]
    chosen = (0, 1, 3, 4, 5, 6)  # the survivors in rank order, then the newcomer
    assert _rack_crossings(chosen, rack) == 4
    ordered = topology.in_topology_order(ta, chosen, domain_of)
    assert ordered == (0, 1, 6, 3, 4, 5)
    assert _rack_crossings(ordered, rack) == 3, "one crossing per rack boundary of the ring"


def test_a_new_lead_keeps_rank_0_and_the_order_wraps_from_its_domain() -> None:
    """Pod 0 was lost: pod 1 leads; the ring starts at pod 1's domain and wraps around, so the
    replacement (in pod 0's domain) closes the ring beside pod 1, in rack1 with it."""
    ta = _assigned()
    key = [topology.domain_key(d.values) for d in ta.domains]
    domain_of = {i: key[i] for i in range(1, 6)} | {6: key[0]}
    ordered = topology.in_topology_order(ta, (1, 2, 3, 4, 5, 6), domain_of)
    assert ordered[0] == 1
    assert ordered == (1, 2, 3, 4, 5, 6)
    # A pod of no known domain (it spilled out of the assignment) goes last, the lead stays.
    spilled = topology.in_topology_order(ta, (3, 9, 1), {1: key[1], 3: key[3]})
    assert spilled == (3, 1, 9)


def _elastic_keep_placed(replicas: int = 6) -> JobView:
    b = job().replicas(replicas).elastic(2, replicas).keep_survivors()
    b.spec["elastic"]["shrinkOnDisruption"] = True
    base = b.build()
    spec = TorchJobSpec.model_validate({**base.spec.to_wire(), "placement": {"required": BLOCK}})
    ta = topology.assignment_of(_assignment(THREE_RACKS))
    return gated(replace(base, spec=spec), replace(ADMITTED, topology=ta))


def _step(view: JobView, pods: list[PodView], now: float) -> tuple[Any, JobView, list[PodView]]:
    """One pass through ``writes.decide``: the new pods carry the domain label it pinned."""
    decided = decide(view, "uid", pods, [], at(now))
    domains = {
        int(w["metadata"]["labels"][contract.LABEL_POD_INDEX]): w["metadata"]["labels"][
            topology.DOMAIN_LABEL
        ]
        for w in decided.workers
    }
    made = [
        replace(p, domain=domains[p.index]) if p.index in domains else p
        for p in apply(decided.plan, pods)
    ]
    return decided.plan, with_state(view, decided.plan.status), made


def test_a_grow_back_publishes_the_replacement_beside_its_racks_survivors() -> None:
    """Through the planner: pod 2 (rack2) is evicted, the job goes on with five, the
    replacement is created in rack2 and, once it waits to join, generation 2 ranks it between
    pod 1 (rack1) and pod 3 (rack2), not after pod 5 (rack3)."""
    _, view, pods = _step(_elastic_keep_placed(), [], 0)
    up = [running(p) for p in pods]
    shrunk, view, pods = _step(view, [evicted(p) if p.index == 2 else p for p in up], 5)
    assert shrunk.status["members"] == [0, 1, 3, 4, 5]
    survivors = [replace(p, generation=1) for p in pods if p.index != 2]
    joining, view, pods = _step(view, survivors, 6)
    assert joining.create is not None and joining.create.indices == (2,)
    grown, view, pods = _step(view, [running(p) for p in pods], 7)
    assert grown.status["currentGeneration"] == 2
    assert grown.status["members"] is None, "ranks 0..5 are pods 0..5 again: rack order"
    # Pod 2's name still taken (its grace period): the replacement is pod 6, in rack2.
    _, view, pods = _step(_elastic_keep_placed(), [], 0)
    up = [running(p) for p in pods]
    _, view, pods = _step(view, [evicted(p) if p.index == 2 else p for p in up], 5)
    held = [replace(p, generation=1) if p.index != 2 else evicted(p) for p in pods]
    joining, view, pods = _step(view, held, 6)
    assert joining.create is not None and joining.create.indices == (6,)
    pods = [p for p in pods if p.index != 2]
    grown, view, pods = _step(view, [running(p) for p in pods], 7)
    assert grown.status["currentGeneration"] == 2
    assert grown.status["members"] == [0, 1, 6, 3, 4, 5]
