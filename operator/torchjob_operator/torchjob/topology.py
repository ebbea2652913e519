"""``spec.placement`` decided: the topology request of the Workload's pod set, Kueue's
``topologyAssignment`` read back, the domain of each pod to create, and, without Kueue, the
pod affinity that asks the default scheduler for the same. Pure; no I/O.

Kueue's Topology-Aware Scheduling (TAS) admits the pod set into domains (a count of pods per
domain of the lowest level of its Topology). Kueue's own pod-based integrations leave their
pods behind a scheduling gate (``kueue.x-k8s.io/topology``) that Kueue lifts after it wrote
the domain's node labels into the pod. The operator instead writes the domain into each pod
it creates, because the domain decides the pod's rank (its env) and a gate lifted by another
controller would come after the env is written. The mapping is Kueue's rank-based ordering
(``assignGatedPodsToDomainsByRanks``): domains sorted by their values from the highest level
to the lowest, pod index ``i`` in the ``i``-th slot, so that neighbours in rank share a host,
then a rack, then a block.

Regrowth in place (``place``): a replacement takes its index's slot when that domain still
has a free slot, else the first domain of the assignment with a free one; with none free
(more pods than the admission counted) it goes to its index's slot all the same and waits
there. Pods carry the hash of their domain (``DOMAIN_LABEL``) so that the planner counts the
taken slots without reading node selectors. The lowest level is pinned with a node selector
like the others, except ``kubernetes.io/hostname``: a host is a preference (node affinity),
so that the replacement of a pod whose node is gone starts on another node of the same
rack instead of waiting for a node that will not come back.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from torchjob import contract
from torchjob.api.models import Placement
from torchjob_operator.common.nodes import NodeView
from torchjob_operator.torchjob.observed import DOMAIN_LABEL, PodView

HOSTNAME: Final = "kubernetes.io/hostname"
SLICE_LABEL: Final = f"{contract.GROUP}/topology-slice"
"""Without Kueue, on the pods of a job with slices: the pod's slice (index // sliceSize)."""
MAX_STATUS_DOMAINS: Final = 256
"""``status.placement.domains`` lists at most this many domains (the status stays small)."""


@dataclass(frozen=True)
class Domain:
    """One domain of an assignment: its value at every level, and the pods it holds."""

    values: tuple[str, ...]
    count: int


@dataclass(frozen=True)
class Assignment:
    """Kueue's ``topologyAssignment`` of the job's pod set, expanded and sorted."""

    levels: tuple[str, ...]
    domains: tuple[Domain, ...]

    @property
    def slots(self) -> tuple[tuple[str, ...], ...]:
        """The domain of each rank: ``count`` slots per domain, in domain order."""
        return tuple(d.values for d in self.domains for _ in range(d.count))


def topology_request(placement: Placement) -> dict[str, Any]:
    """The pod set's ``topologyRequest`` (kueue.x-k8s.io/v1beta2)."""
    request: dict[str, Any] = {"podIndexLabel": contract.LABEL_POD_INDEX}
    if placement.required is not None:
        request["required"] = placement.required
    else:
        request["preferred"] = placement.preferred
    if placement.slice_level is not None:
        request["podSetSliceRequiredTopology"] = placement.slice_level
        request["podSetSliceSize"] = placement.slice_size
    return request


def _value(values: Mapping[str, Any], i: int) -> str:
    if values.get("universal") is not None:
        return str(values["universal"])
    ind = values.get("individual") or {}
    return f"{ind.get('prefix') or ''}{ind['roots'][i]}{ind.get('suffix') or ''}"


def _count(counts: Mapping[str, Any], i: int) -> int:
    if counts.get("universal") is not None:
        return int(counts["universal"])
    return int(counts["individual"][i])


def assignment_of(topology: Mapping[str, Any] | None) -> Assignment | None:
    """A v1beta2 ``topologyAssignment`` (levels and compressed slices, as Kueue's
    ``InternalSeqFrom`` reads them) -> its domains in Kueue's order, which is sorted by their
    values at every level of the Topology, the highest first (``buildAssignment``), even when
    it lists only the hosts; None without one (or one this reader cannot parse)."""
    if not topology:
        return None
    levels = tuple(str(x) for x in topology.get("levels") or ())
    domains: list[Domain] = []
    try:
        for s in topology.get("slices") or ():
            per_level = s.get("valuesPerLevel") or []
            for i in range(int(s.get("domainCount") or 0)):
                values = tuple(_value(per_level[level], i) for level in range(len(levels)))
                domains.append(Domain(values, _count(s.get("podCounts") or {}, i)))
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not levels or not domains:
        return None
    return Assignment(levels, tuple(domains))


def topology_of(wl: Mapping[str, Any], pod_set: str) -> Assignment | None:
    """A Workload's admission's ``topologyAssignment`` of ``pod_set``, as Kueue wrote it."""
    admission = (wl.get("status") or {}).get("admission") or {}
    for psa in admission.get("podSetAssignments") or []:
        if psa.get("name") == pod_set:
            return assignment_of(psa.get("topologyAssignment"))
    return None


def host_only(assignment: Assignment | None) -> bool:
    """Kueue names only the hosts when ``kubernetes.io/hostname`` is its Topology's lowest
    level: their other levels are the nodes' labels."""
    return assignment is not None and assignment.levels == (HOSTNAME,)


def from_held(assignment: Assignment | None, held: Mapping[str, Any] | None) -> Assignment | None:
    """The job's ``status.placement`` when it is ``assignment`` with every level filled in
    (the same hosts with the same counts, in the same order): read once per admission."""
    if not host_only(assignment) or not held:
        return None
    assert assignment is not None
    levels = tuple(str(x) for x in held.get("levels") or ())
    domains = tuple(
        Domain(tuple(str(v) for v in d.get("values") or ()), int(d.get("workers") or 0))
        for d in held.get("domains") or ()
    )
    if not levels or levels[-1] != HOSTNAME or any(len(d.values) != len(levels) for d in domains):
        return None
    if [(d.values[-1], d.count) for d in domains] != [
        (d.values[0], d.count) for d in assignment.domains
    ]:
        return None
    return Assignment(levels, domains)


def host_selector(assignment: Assignment) -> str:
    """The label selector of the assignment's hosts."""
    return f"{HOSTNAME} in ({','.join(sorted({d.values[-1] for d in assignment.domains}))})"


def complete(
    assignment: Assignment, levels: Sequence[str], nodes: Mapping[str, Mapping[str, str]]
) -> Assignment:
    """A host-only assignment with each host's value at every level of the Topology
    (``levels``, highest first, the host last); a host whose node is gone keeps its host
    only, and so does an assignment whose Topology could not be read."""
    if not host_only(assignment) or not levels or levels[-1] != HOSTNAME:
        return assignment
    filled = []
    for d in assignment.domains:
        labels = nodes.get(d.values[0]) or {}
        values = tuple(labels.get(level, "") for level in levels[:-1]) + d.values
        filled.append(Domain(values, d.count))
    return Assignment(tuple(levels), tuple(filled))


def domain_key(values: Sequence[str]) -> str:
    """The value of ``DOMAIN_LABEL`` for a domain: a label value whatever the node labels are."""
    return hashlib.sha256(json.dumps(list(values)).encode()).hexdigest()[:16]


def place(
    assignment: Assignment, indices: Iterable[int], taken: Iterable[str]
) -> dict[int, tuple[str, ...]]:
    """The domain of each pod to create. ``taken``: the ``DOMAIN_LABEL`` of every live pod of
    the job (those that stay). Pod ``i`` goes to slot ``i`` while its domain has room, else to
    the first domain with room; with no room anywhere, to slot ``i`` (it waits there: the
    documented rule, docs/fits-your-cluster.md)."""
    slots = assignment.slots
    room = Counter({domain_key(d.values): d.count for d in assignment.domains})
    room.subtract(Counter(taken))
    out: dict[int, tuple[str, ...]] = {}
    for i in indices:
        values = slots[i % len(slots)]
        if room[domain_key(values)] <= 0:
            free = [d.values for d in assignment.domains if room[domain_key(d.values)] > 0]
            values = free[0] if free else values
        room[domain_key(values)] -= 1
        out[i] = values
    return out


def in_topology_order(
    assignment: Assignment, members: Sequence[int], domain_of: Mapping[int, str]
) -> tuple[int, ...]:
    """A re-formed generation's rank order along the topology. ``members``: its pod indices
    as the planner chose them (the survivors in their rank order, then the newcomers);
    ``domain_of``: each pod's ``DOMAIN_LABEL``. The first member keeps rank 0 (the pod that
    leads: it runs and its name resolves, the newcomers join its rendezvous); the others
    follow in the assignment's domain order, starting at the lead's domain and wrapping
    around (a ring's order is cyclic), so that the pods of one domain are contiguous in rank
    whichever pod was lost. Pods of the same domain keep their order in ``members``; a pod of
    no known domain (it spilled out) goes last."""
    if len(members) < 2:
        return tuple(members)
    position = {domain_key(d.values): k for k, d in enumerate(assignment.domains)}
    n = len(position) + 1
    lead = members[0]
    start = position.get(domain_of.get(lead, ""), 0)
    chosen = {i: k for k, i in enumerate(members)}

    def key(i: int) -> tuple[int, int, int]:
        at = position.get(domain_of.get(i, ""))
        return (n if at is None else (at - start) % n, i != lead, chosen[i])

    return tuple(sorted(members, key=key))


def pin(
    pod: dict[str, Any], levels: Sequence[str], values: Sequence[str], *, strict: bool = True
) -> dict[str, Any]:
    """``pod`` placed in the domain ``values`` of ``levels`` (in place, and returned): a node
    selector for each level (``strict``: a required request) or a node affinity preference
    (a preferred one: a replacement spills over when the domain has no room); the host is
    always only preferred (see the module docstring). Also the domain's hash label and
    ``TORCHJOB_TOPOLOGY`` in every container."""
    spec = pod.setdefault("spec", {})
    meta = pod.setdefault("metadata", {})
    domain = {k: v for k, v in zip(levels, values, strict=True) if v}
    host = domain.pop(HOSTNAME, None)
    preferred = {} if host is None else {HOSTNAME: host}
    if strict:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **domain}
    else:
        preferred.update(domain)
    if preferred:
        affinity = spec.setdefault("affinity", {})
        node = affinity.setdefault("nodeAffinity", {})
        node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {
                "weight": 100,
                "preference": {
                    "matchExpressions": [
                        {"key": k, "operator": "In", "values": [v]}
                        for k, v in sorted(preferred.items())
                    ]
                },
            }
        )
    meta.setdefault("labels", {})[DOMAIN_LABEL] = domain_key(values)
    _set_env(spec, contract.TOPOLOGY, contract.topology_env(domain))
    return pod


def _set_env(spec: dict[str, Any], name: str, value: str) -> None:
    for container in spec.get("containers") or ():
        env = [e for e in container.get("env") or () if e.get("name") != name]
        container["env"] = [*env, {"name": name, "value": value}]


def co_locate(pod: dict[str, Any], job: str, placement: Placement, index: int) -> dict[str, Any]:
    """Without Kueue: the same request as pod affinity the default scheduler honours (in
    place, and returned). Every worker with the job's pods in one domain of the level
    (required, or preferred with weight 100); with slices, each slice's pods in one domain of
    ``sliceLevel`` as well. The first pod may go anywhere: the affinity follows it."""
    spec = pod.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {}).setdefault("podAffinity", {})
    job_pods = {contract.LABEL_JOB_NAME: job, contract.LABEL_ROLE: contract.ROLE_WORKER}
    term = {"labelSelector": {"matchLabels": job_pods}, "topologyKey": placement.level}
    if placement.required is not None:
        affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    else:
        affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": 100, "podAffinityTerm": term}
        )
    if placement.slice_level is not None and placement.slice_size:
        group = str(index // placement.slice_size)
        pod.setdefault("metadata", {}).setdefault("labels", {})[SLICE_LABEL] = group
        affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {
                "labelSelector": {"matchLabels": {**job_pods, SLICE_LABEL: group}},
                "topologyKey": placement.slice_level,
            }
        )
    return pod


@dataclass(frozen=True)
class Spill:
    """A worker running outside the job's domains at the requested level."""

    pod: str
    node: str
    value: str
    """Its node's value at the requested level."""


def spilled(
    assignment: Assignment, level: str, pods: Iterable[PodView], nodes: Mapping[str, NodeView]
) -> tuple[tuple[Spill, ...], int]:
    """The workers whose node is in none of the job's domains at ``level`` (its values at
    ``level`` and every level above it match no domain of the assignment), and how many
    workers were judged. ``nodes``: the Node watch's views. A pod on a node the watch does not know, or without one of those
    labels, is not judged."""
    if level not in assignment.levels:
        return (), 0
    keys = assignment.levels[: assignment.levels.index(level) + 1]
    held = {d.values[: len(keys)] for d in assignment.domains}
    out: list[Spill] = []
    judged = 0
    for p in pods:
        view = nodes.get(p.node) if p.node else None
        values = tuple(view.label(k) for k in keys) if view is not None else (None,)
        if any(v is None for v in values):
            continue
        judged += 1
        if values not in held:
            out.append(Spill(p.name, p.node, str(values[-1])))
    return tuple(out), judged


def held(assignment: Assignment) -> dict[str, Any]:
    """``status.placement``: the levels and the domains the job holds (the admission's), with
    the workers each one holds."""
    return {
        "levels": list(assignment.levels),
        "domains": [
            {"values": list(d.values), "workers": d.count}
            for d in assignment.domains[:MAX_STATUS_DOMAINS]
        ],
    }


__all__ = [
    "DOMAIN_LABEL",
    "HOSTNAME",
    "SLICE_LABEL",
    "Assignment",
    "Domain",
    "Spill",
    "assignment_of",
    "co_locate",
    "complete",
    "domain_key",
    "from_held",
    "held",
    "host_only",
    "host_selector",
    "pin",
    "place",
    "spilled",
    "topology_of",
    "topology_request",
]
