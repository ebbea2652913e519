"""Read one TorchJob's world into one immutable view: the job, its pods, its Kueue
Workload. All of a pass's reads happen here, before anything is decided or written;
what is read next depends only on what was read before (an invalid spec stops the
reads, as does a Workload that is not this job's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from torchjob.api.models import TorchJobSpec
from torchjob_operator.common.nodes import NodeView
from torchjob_operator.engine.kube import Kube, KubeError
from torchjob_operator.torchjob import admission, blueprint, initializers, kueue, managed, topology
from torchjob_operator.torchjob.decision import JobView
from torchjob_operator.torchjob.nodes import with_nodes
from torchjob_operator.torchjob.observed import (
    JobState,
    PodView,
    ProbeView,
    pod_view,
    probe_view,
    split_by_owner,
)
from torchjob_operator.torchjob.status import validation_message


@dataclass(frozen=True)
class Observed:
    """One TorchJob as this pass found it."""

    job: Mapping[str, Any]
    spec: TorchJobSpec | None
    """None: the spec is invalid (``invalid`` says why) and nothing else was read."""
    invalid: str | None = None
    state: JobState = field(default_factory=JobState)
    raw_pods: tuple[dict[str, Any], ...] = ()
    """This job's pods as listed (their uids are the deletions' preconditions)."""
    pods: tuple[PodView, ...] = ()
    probes: tuple[ProbeView, ...] = ()
    foreign: tuple[str, ...] = ()
    """Pods of an earlier same-named TorchJob (another controller uid)."""
    workload: admission.WorkloadSeen | None = None
    """The Kueue Workload's reads; None: Kueue does not manage the job."""
    pin: Mapping[str, Any] | None = None
    """``status.runtime`` to write first: the runtime blueprint this pass resolved (once)."""
    reason: str = "InvalidSpec"
    """Why ``spec`` is None: ``InvalidSpec``, ``RuntimeNotFound``, ``InvalidRuntimeMerge``."""
    retry_after_s: float | None = None
    """When an invalid job looks again by itself (a missing blueprint); None: on a change."""
    initializer_pods: tuple[initializers.InitPod, ...] = ()
    avoid_nodes: tuple[str, ...] = ()
    """Nodes no new pod of the job goes to (noticed or not reporting)."""
    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    """The Node watch's views (``JobView.nodes``)."""

    def view(self, spec: TorchJobSpec, gate: kueue.Gate | None) -> JobView:
        """What the planner is given: the job, with its Workload's ``gate``."""
        meta = self.job["metadata"]
        return JobView(
            name=meta["name"],
            namespace=meta["namespace"],
            spec=spec,
            state=self.state,
            metadata_generation=meta.get("generation"),
            foreign_pods=self.foreign,
            kueue=gate,
            initializers=initializers.decide_initializers(
                spec, self.job.get("status"), self.initializer_pods
            ),
            avoid_nodes=self.avoid_nodes,
            nodes=self.nodes,
        )


def observe(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    nodes: Mapping[str, NodeView] | None = None,
    avoid: tuple[str, ...] = (),
    now: datetime | None = None,
) -> Observed | None:
    """Everything one pass needs; None when the job is gone or being deleted. ``nodes``: what
    the Node watch knows; a pod on a noticed or silent node says so (``nodes.with_nodes``).
    ``avoid``: the nodes new pods are kept off (``NodeBook.avoid``)."""
    job = kube.get_job(namespace, name)
    if job is None or (job.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if managed.managed_by(job) not in (managed.OURS, managed.MULTIKUEUE):
        return Observed(job, None)  # another controller's: nothing else is read
    try:
        ref = blueprint.ref_of(job.get("spec") or {})
        spec = TorchJobSpec.model_validate(job.get("spec") or {}) if ref is None else None
    except ValidationError as err:
        detail = f"TorchJob {namespace}/{name} has an invalid spec: {validation_message(err)}"
        return Observed(job, None, invalid=detail)
    pin = None
    if ref is not None:  # the blueprint: pinned, else read (once) and pinned by this pass
        pinned = blueprint.pinned(job, ref)
        fetched = None if pinned else kube.get_runtime(ref.kind.value, namespace, ref.name)
        got = blueprint.resolve_runtime(job, ref, pinned, fetched)
        if got.spec is None:
            return Observed(
                job, None, got.detail, reason=got.reason, retry_after_s=got.retry_after_s
            )
        spec, pin = got.spec, got.pin
    assert spec is not None  # validated as written, or merged over its blueprint
    # Only this job's pods count: a same-named earlier job's (another controller uid) wait.
    raw_pods, foreign = split_by_owner(
        kube.list_worker_pods(namespace, name), job["metadata"]["uid"]
    )
    state = JobState.from_status(job.get("status") or {})
    return Observed(
        job,
        spec,
        state=state,
        raw_pods=tuple(raw_pods),
        pods=_on_nodes(
            (v for v in (pod_view(p) for p in raw_pods) if v is not None), nodes, now, state
        ),
        probes=tuple(v for v in (probe_view(p) for p in raw_pods) if v is not None),
        foreign=tuple(foreign),
        initializer_pods=tuple(
            v for v in (initializers.init_pod_view(p) for p in raw_pods) if v is not None
        ),
        workload=_workload(kube, job, spec, state),
        pin=pin,
        avoid_nodes=avoid,
        nodes=nodes or {},
    )


def _on_nodes(
    pods: Iterable[PodView],
    nodes: Mapping[str, NodeView] | None,
    now: datetime | None,
    state: JobState,
) -> tuple[PodView, ...]:
    if not nodes:
        return tuple(pods)
    return with_nodes(pods, nodes, now or datetime.now(timezone.utc), state.leaving)


def _topology(
    kube: Kube,
    job: Mapping[str, Any],
    workload: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
) -> topology.Assignment | None:
    """The admission's topology assignment with every level filled in: Kueue names only the
    hosts when its Topology ends at ``kubernetes.io/hostname``, so their other levels are
    read once per admission (the Topology, one LIST of those nodes) and kept in
    ``status.placement``, which later passes read instead."""
    assigned = topology.topology_of(workload, kueue.POD_SET)
    held = topology.from_held(assigned, (job.get("status") or {}).get("placement"))
    if held is not None or assigned is None or not topology.host_only(assigned):
        return held or assigned
    name = next((str(f["topologyName"]) for f in flavors.values() if f.get("topologyName")), "")
    found = kube.get_kueue_object("topologies", name) if name else None
    levels = [
        str(x.get("nodeLabel")) for x in ((found or {}).get("spec") or {}).get("levels") or ()
    ]
    if not levels:
        return assigned
    return topology.complete(assigned, levels, kube.node_labels(topology.host_selector(assigned)))


def _workload(
    kube: Kube, job: Mapping[str, Any], spec: TorchJobSpec, state: JobState
) -> admission.WorkloadSeen | None:
    """The reads ``admission.sync`` decides from, in its order; a failed read ends them."""
    meta = job["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    labels = meta.get("labels") or {}
    queue = kueue.queue_of(
        labels,
        spec.scheduling.queue_name,
        ((job.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels"),
    )
    if queue is None:
        return None
    prebuilt = managed.prebuilt_workload(job)
    seen = admission.WorkloadSeen(
        job=f"{namespace}/{name}",
        queue=queue,
        name=prebuilt or kueue.workload_name(name),
        prebuilt=prebuilt is not None,
    )
    try:
        existing = kube.get_workload(namespace, seen.name)
        seen = replace(seen, existing=existing)
        if state.phase is not None and state.phase.is_terminal:
            return replace(seen, terminal=True)
        if existing is not None and not admission.owns(existing, uid, seen.prebuilt):
            return replace(seen, owned=False)
        priority_class = labels.get(kueue.PRIORITY_LABEL)
        priority = None
        if priority_class:
            wpc = kube.get_kueue_object("workloadpriorityclasses", priority_class)
            if wpc is None:
                return replace(seen, priority_class=priority_class, missing_priority_class=True)
            priority = int(wpc.get("value", 0))
        desired, count = admission.desired(job, spec, queue, priority_class, priority)
        seen = replace(seen, priority_class=priority_class, desired=desired, count=count)
        if existing is None or not admission.wants_flavors(seen):
            return seen
        flavors: dict[str, Mapping[str, Any]] = {}
        for flavor in kueue.flavor_names(existing):
            rf = kube.get_kueue_object("resourceflavors", flavor)
            flavors[flavor] = (rf or {}).get("spec") or {}
        placed = _topology(kube, job, existing, flavors)
        return replace(seen, flavors=flavors, topology=placed)
    except KubeError as e:
        return replace(seen, failure=admission.Failure(str(e), e.status))
