"""The writes of one pass as data: the plan, the writes before any pod (the runtime pin, the
Kueue Workload) and the manifests that carry the plan out (worker pods with their Kueue
admission, capacity probes, the Service, the worker account, the PodGroup). Pure; ``act``
sends them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from torchjob import contract
from torchjob.api.models import Phase, TorchJobSpec
from torchjob_operator.common.events import Event
from torchjob_operator.common.nodes import AVOIDED_NODES, why_avoided
from torchjob_operator.resources.initializers import initializer_pod
from torchjob_operator.resources.pods import (
    avoid_nodes,
    headless_service,
    pod_group,
    prefer_other_nodes,
    probe_pod,
    spread_across_nodes,
    worker_pod,
)
from torchjob_operator.resources.rbac import worker_rbac
from torchjob_operator.torchjob import initializers, kueue, topology
from torchjob_operator.torchjob.admission import WorkloadSeen, WorkloadStep
from torchjob_operator.torchjob.decision import JobView, Plan
from torchjob_operator.torchjob.nodes import suspect_nodes
from torchjob_operator.torchjob.observed import PodView, ProbeView
from torchjob_operator.torchjob.plan import plan


@dataclass(frozen=True)
class First:
    """Step 0 of ``act``, made before any pod, in this order: the runtime blueprint the job
    keeps (``pin``: ``status.runtime``, recorded before a pod is built from it, so that a
    crash never rebuilds the job from a newer version), then the Kueue Workload's create or
    delete (``workload``, with what ``observe`` read of it, to judge the answer)."""

    pin: Mapping[str, Any] | None = None
    workload: WorkloadStep | None = None
    seen: WorkloadSeen | None = None
    phase: Phase | None = None

    @property
    def writes_workload(self) -> bool:
        w = self.workload
        return w is not None and (w.create is not None or w.delete is not None)


@dataclass(frozen=True)
class Decided:
    """The plan of one pass, the pods it creates (built together: an error building a pod is
    the spec's, as an error planning is) and the writes that come before them."""

    plan: Plan
    workers: tuple[dict[str, Any], ...]
    probes: tuple[dict[str, Any], ...]
    events: tuple[Event, ...]
    """The Workload's Events (as read), then the plan's."""
    initializers: tuple[dict[str, Any], ...] = ()
    """The initialiser pods the plan creates (``spec.initializers``)."""
    first: First = First()


def decide(
    view: JobView,
    uid: str,
    pods: Sequence[PodView],
    probes: Sequence[ProbeView],
    now: datetime,
    first: First = First(),
) -> Decided:
    """Plan the job and build the pods the plan creates. ``first``: the writes before them
    (the view's gate is the Workload step's: closed while the Workload is being made)."""
    before = first.workload.events if first.workload is not None else ()
    decided = plan(view, pods, now, probes)
    name, namespace, spec = view.name, view.namespace, view.spec
    workers = worker_bodies(name, namespace, uid, spec, decided)
    if view.kueue is not None:
        for body in workers:
            kueue.apply_admission(body, view.kueue.assignment)
    decided = _place(view, pods, workers, decided)
    suspect = suspect_nodes(view.state, pods, view.avoid_nodes, name, now, view.nodes)
    keep_off = decided.create.avoid if decided.create is not None else ()
    for body in workers:
        avoid_nodes(body, tuple(dict.fromkeys((*view.avoid_nodes, *keep_off))))
        if view.avoid_nodes:  # what the Node watch said, not a move's keep_off
            body["metadata"].setdefault("annotations", {})[AVOIDED_NODES] = ",".join(
                view.avoid_nodes
            )
        prefer_other_nodes(body, suspect)
        if suspect and body["spec"].get("topologySpreadConstraints") == [spread_across_nodes(name)]:
            # The default spread (ScheduleAnyway) scores the suspect node best, since it now
            # holds none of the job's pods, as much as the preference scores it worst: the
            # replacement goes by the preference. A spread of the job's own stays.
            del body["spec"]["topologySpreadConstraints"]
    probe_bodies = tuple(
        probe_pod(name=name, namespace=namespace, uid=uid, spec=spec, index=index)
        for index in decided.create_probes
    )
    _place_probes(view, pods, probe_bodies, decided)
    init = view.initializers
    inits: tuple[dict[str, Any], ...] = ()
    init_events: tuple[Event, ...] = ()
    if init is not None:  # the status records every initialiser's outcome, every pass
        decided = replace(decided, status={**decided.status, "initializers": init.status()})
        inits = tuple(
            initializer_pod(name=name, namespace=namespace, uid=uid, spec=spec, kind=kind)
            for kind in decided.initialize
        )
        init_events = (
            *init.events,
            *initializers.created_events(name, spec, decided.initialize),
        )
    events = (*before, *init_events, *decided.events, *kept_off_nodes(view, workers))
    return Decided(decided, workers, probe_bodies, events, inits, first)


def kept_off_nodes(view: JobView, workers: Sequence[dict[str, Any]]) -> tuple[Event, ...]:
    """A ``KeptOffNodes`` Event when new worker pods keep off nodes the Node and Lease watches
    gave (``view.avoid_nodes``), each with why: what ``kubectl describe`` shows of a pod that
    waits for a node while one looks free."""
    if not workers or not view.avoid_nodes:
        return ()
    pods = ", ".join(str(body["metadata"]["name"]) for body in workers)
    nodes = why_avoided(view.avoid_nodes, view.nodes)
    return (Event.of("KeptOffNodes", pods=pods, nodes=nodes),)


def _place(
    view: JobView, pods: Sequence[PodView], workers: Sequence[dict[str, Any]], decided: Plan
) -> Plan:
    """``spec.placement``: each new worker in its domain of the admission's topology
    assignment (``torchjob.topology``), and the domains in the status; without Kueue, the
    request as pod affinity. In place on ``workers``."""
    placement = view.spec.placement
    assigned = view.kueue.topology if view.kueue is not None else None
    if assigned is not None:
        doomed = set(decided.delete)
        taken = [p.domain for p in pods if p.active and p.domain and p.name not in doomed]
        index = {int(w["metadata"]["labels"][contract.LABEL_POD_INDEX]): w for w in workers}
        for i, values in topology.place(assigned, sorted(index), taken).items():
            strict = placement is None or placement.required is not None
            topology.pin(index[i], assigned.levels, values, strict=strict)
        return replace(decided, status={**decided.status, "placement": topology.held(assigned)})
    if placement is not None and view.kueue is None:
        for w in workers:
            index_label = w["metadata"]["labels"][contract.LABEL_POD_INDEX]
            topology.co_locate(w, view.name, placement, int(index_label))
    return decided


def _place_probes(
    view: JobView, pods: Sequence[PodView], probes: Sequence[dict[str, Any]], decided: Plan
) -> None:
    """Each capacity probe where the worker it stands for would go, so that a probe that fits
    proves room where the grow-back will be placed: in the job's domains of the admission (the
    free slots first, as ``topology.place`` gives the grow-back's pods), or, without Kueue,
    with the job's pod affinity; with the admission's node selector and tolerations; never
    on a node new pods avoid. In place on ``probes``."""
    placement = view.spec.placement
    assigned = view.kueue.topology if view.kueue is not None else None
    doomed = set(decided.delete)
    live = [p for p in pods if p.active and p.name not in doomed]
    # The flavor's node selector and tolerations (not Kueue's labels: a probe is no member).
    flavor = None
    if view.kueue is not None:
        flavor = replace(view.kueue.assignment, labels={}, annotations={})
    for k, probe in enumerate(probes):
        avoid_nodes(probe, view.avoid_nodes)
        if flavor is not None:
            kueue.apply_admission(probe, flavor)
        if placement is not None and assigned is None and view.kueue is None:
            topology.co_locate(probe, view.name, placement, len(live) + k)
    if assigned is None or not probes:
        return
    taken = [p.domain for p in live if p.domain]
    strict = placement is None or placement.required is not None
    indices = [len(live) + k for k in range(len(probes))]
    for probe, (_, values) in zip(
        probes, sorted(topology.place(assigned, indices, taken).items()), strict=True
    ):
        topology.pin(probe, assigned.levels, values, strict=strict)


def worker_bodies(
    name: str, namespace: str, uid: str, spec: TorchJobSpec, decided: Plan
) -> tuple[dict[str, Any], ...]:
    if decided.create is None:
        return ()
    c = decided.create
    return tuple(
        worker_pod(
            name=name,
            namespace=namespace,
            uid=uid,
            spec=spec,
            index=i,
            generation=c.generation,
            replicas=c.replicas,
            joiner=c.joiners,
            members=c.members,
        )
        for i in c.indices
    )


@dataclass(frozen=True)
class Around:
    """What the pods need around them, made before them: the headless Service (with the
    pods it serves), the worker ServiceAccount/Role/RoleBinding (the ServiceAccount
    admission plugin rejects pods whose account is missing), the gang's PodGroup."""

    service: dict[str, Any] | None
    rbac: tuple[tuple[str, dict[str, Any]], ...]
    group: dict[str, Any] | None


def around(name: str, namespace: str, uid: str, spec: TorchJobSpec, decided: Plan) -> Around:
    service = (
        headless_service(name=name, namespace=namespace, uid=uid)
        if decided.ensure_service
        else None
    )
    rbac = (
        tuple(worker_rbac(name=name, namespace=namespace, uid=uid))
        if decided.create is not None
        else ()
    )
    gang = spec.scheduling.gang
    group = (
        pod_group(
            name=name,
            namespace=namespace,
            uid=uid,
            gang=gang,
            min_member=decided.create.replicas,
        )
        if gang is not None and decided.create is not None
        else None
    )
    return Around(service, rbac, group)
