"""Kueue admission of a TorchJob through a Workload the operator owns. Pure; no I/O.

Kueue knows no TorchJob, so the operator speaks the protocol Kueue's jobframework speaks for
the kinds it does know (docs/fits-your-cluster.md):

* a TorchJob with a LocalQueue (the ``kueue.x-k8s.io/queue-name`` label, or
  ``spec.scheduling.queueName``) gets one ``Workload`` (``desired_workload``), owned by the
  job (controller=true): one pod set, ``workers``, of ``spec.replicas`` pods with the
  requests of the worker pod itself;
* until the Workload is admitted, no pod exists (the job is Suspended, reason
  ``WaitingForAdmission``);
* once admitted, the pods get the admission's node labels and tolerations (from the assigned
  ResourceFlavors) and the admission checks' PodSetUpdates (``apply_admission``);
* an eviction (preemption, a quota taken back, deactivation) stops the pods gracefully and
  suspends the job (reason ``AdmissionEvicted``); once no pod is left, the operator hands the
  quota back (``release_patch``) and Kueue queues the Workload again; a new admission resumes
  the job from its latest checkpoint in a new generation. The restart budget is not charged;
* when the job ends, the Workload is marked Finished (``finish_patch``) and its quota freed.

A spec change that changes the pod set (a scale, other requests) makes the Workload stale
(``matches``): the operator deletes it and creates the new one, which queues again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from torchjob import contract
from torchjob.api.models import GROUP, VERSION
from torchjob_operator.common.conditions import set_conditions
from torchjob_operator.torchjob.topology import Assignment as Topology
from torchjob_operator.torchjob.topology import topology_of

KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
WORKLOAD_API: Final = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
QUEUE_LABEL: Final = contract.KUEUE_QUEUE_LABEL
PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
POD_SET: Final = "workers"
SPEC_HASH: Final = "torchjob.io/workload-spec"
"""Annotation of the Workload: the hash of the pod set it was made for (``matches``)."""

# Workload condition types (kueue.x-k8s.io/v1beta2)
QUOTA_RESERVED: Final = "QuotaReserved"
ADMITTED: Final = "Admitted"
EVICTED: Final = "Evicted"
FINISHED: Final = "Finished"
REQUEUED: Final = "Requeued"

_REQUEUE_REASONS: Final = ("Preempted", "NodeFailures")
"""Eviction reasons after which Kueue's jobframework sets Requeued=True (the rest: False)."""


def workload_name(job: str) -> str:
    return f"torchjob-{job}"


def queue_of(
    labels: Mapping[str, str],
    spec_queue: str | None,
    template_labels: Mapping[str, str] | None = None,
) -> str | None:
    """The LocalQueue of a job: its ``kueue.x-k8s.io/queue-name`` label, else
    ``spec.scheduling.queueName``, else the pod template's label (the API refuses a template
    label that differs from queueName); None: Kueue does not manage it
    (``manageJobsWithoutQueueName`` is not supported)."""
    return labels.get(QUEUE_LABEL) or spec_queue or (template_labels or {}).get(QUEUE_LABEL)


@dataclass(frozen=True)
class Assignment:
    """What an admission puts on the pods."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Gate:
    """The Workload as the planner sees it."""

    admitted: bool = False
    evicted: str | None = None
    """The Evicted condition's reason and message, while it is True."""
    holds_quota: bool = False
    """QuotaReserved=True or an admission recorded: the quota is this job's."""
    finished: bool = False
    assignment: Assignment = field(default_factory=Assignment)
    flavors: tuple[str, ...] = ()
    """The ResourceFlavors of the admission (their nodeLabels and tolerations go on the pods)."""
    workload: str = ""
    queue: str = ""
    topology: Topology | None = None
    """The admission's ``topologyAssignment`` (``spec.placement``, Kueue's TAS)."""
    pending: str = ""
    """Why Kueue has not reserved quota yet (its QuotaReserved=False message), if it said."""


def _cond(wl: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c  # type: ignore[no-any-return]
    return None


def _true(wl: Mapping[str, Any], type_: str) -> bool:
    c = _cond(wl, type_)
    return c is not None and c.get("status") == "True"


def gate_of(
    wl: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]], *, queue: str = ""
) -> Gate:
    """The gate of Workload ``wl``; ``flavors`` maps a ResourceFlavor's name to its spec."""
    status = wl.get("status") or {}
    admission = status.get("admission") or {}
    evicted = _cond(wl, EVICTED)
    evicted_by = (
        f"{evicted.get('reason')}: {evicted.get('message', '')}".rstrip(": ")
        if evicted is not None and evicted.get("status") == "True"
        else None
    )
    names: list[str] = []
    for psa in admission.get("podSetAssignments") or []:
        if psa.get("name") == POD_SET:
            names = sorted(set((psa.get("flavors") or {}).values()))
    reserved = _cond(wl, QUOTA_RESERVED)
    pending = (
        str(reserved.get("message") or "")
        if reserved is not None and reserved.get("status") == "False"
        else ""
    )
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for n in names:
        spec = flavors.get(n) or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations.extend(spec.get("tolerations") or [])
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for check in status.get("admissionChecks") or []:
        for upd in check.get("podSetUpdates") or []:
            if upd.get("name") != POD_SET:
                continue
            labels.update(upd.get("labels") or {})
            annotations.update(upd.get("annotations") or {})
            selector.update(upd.get("nodeSelector") or {})
            tolerations.extend(upd.get("tolerations") or [])
    return Gate(
        admitted=_true(wl, ADMITTED) and evicted_by is None,
        evicted=evicted_by,
        holds_quota=_true(wl, QUOTA_RESERVED) or bool(admission),
        finished=_true(wl, FINISHED),
        assignment=Assignment(
            node_selector=selector,
            tolerations=tuple(tolerations),
            labels=labels,
            annotations=annotations,
        ),
        flavors=tuple(names),
        workload=str((wl.get("metadata") or {}).get("name", "")),
        queue=queue,
        topology=topology_of(wl, POD_SET),
        pending=pending,
    )


def flavor_names(wl: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceFlavors the Workload's admission assigns (to read before ``gate_of``)."""
    out: set[str] = set()
    admission = (wl.get("status") or {}).get("admission") or {}
    for psa in admission.get("podSetAssignments") or []:
        if psa.get("name") == POD_SET:
            out.update((psa.get("flavors") or {}).values())
    return tuple(sorted(out))


def _pod_set_template(worker: Mapping[str, Any]) -> dict[str, Any]:
    """The pod set's template: the worker pod's spec, which carries its requests, node
    selector, affinity and tolerations (what Kueue matches flavors and quota against)."""
    labels = {
        k: v
        for k, v in ((worker.get("metadata") or {}).get("labels") or {}).items()
        if k != QUEUE_LABEL
    }
    spec = {k: v for k, v in (worker.get("spec") or {}).items() if k not in ("hostname",)}
    return {"metadata": {"labels": labels}, "spec": spec}


def _requests(template: Mapping[str, Any]) -> Any:
    spec = template.get("spec") or {}
    return [
        [(c.get("resources") or {}).get("requests") or {} for c in spec.get(kind) or []]
        for kind in ("initContainers", "containers")
    ] + [spec.get("nodeSelector"), spec.get("tolerations"), spec.get("affinity")]


def spec_hash(
    count: int,
    template: Mapping[str, Any],
    priority_class: str | None,
    topology: Mapping[str, Any] | None = None,
) -> str:
    extra = [topology] if topology else []  # jobs without one keep their hash
    blob = json.dumps([count, _requests(template), priority_class, *extra], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def desired_workload(
    *,
    name: str,
    namespace: str,
    uid: str,
    queue: str,
    count: int,
    worker: Mapping[str, Any],
    priority_class: str | None,
    priority: int | None,
    topology: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Workload of TorchJob ``name``: one pod set of ``count`` pods like ``worker``
    (the manifest of worker 0), with the ``topologyRequest`` of ``spec.placement``. No
    ``minCount``: a TorchJob is admitted whole (see docs/fits-your-cluster.md for elastic
    jobs)."""
    template = _pod_set_template(worker)
    pod_set: dict[str, Any] = {"name": POD_SET, "count": count, "template": template}
    if topology:
        pod_set["topologyRequest"] = dict(topology)
    spec: dict[str, Any] = {"queueName": queue, "podSets": [pod_set]}
    if priority_class is not None:
        spec["priorityClassRef"] = {
            "group": KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
        if priority is not None:
            spec["priority"] = priority
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(name),
            "namespace": namespace,
            "labels": {contract.LABEL_JOB_NAME: name},
            "annotations": {SPEC_HASH: spec_hash(count, template, priority_class, topology)},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "TorchJob",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def matches(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """The existing Workload was made for the pod set the job wants now."""
    ann = (existing.get("metadata") or {}).get("annotations") or {}
    return bool(ann.get(SPEC_HASH) == desired["metadata"]["annotations"][SPEC_HASH])


def owned_by(existing: Mapping[str, Any], uid: str) -> bool:
    return any(
        bool(ref.get("controller")) and ref.get("uid") == uid
        for ref in (existing.get("metadata") or {}).get("ownerReferences") or []
    )


def apply_admission(pod: dict[str, Any], assignment: Assignment) -> dict[str, Any]:
    """``pod`` with the admission's node selector, tolerations and PodSetUpdates (in place,
    and returned). The admission wins over the template where both set a node label."""
    meta = pod.setdefault("metadata", {})
    spec = pod.setdefault("spec", {})
    if assignment.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **assignment.node_selector}
    if assignment.tolerations:
        have = list(spec.get("tolerations") or [])
        spec["tolerations"] = have + [dict(t) for t in assignment.tolerations if t not in have]
    if assignment.labels:
        meta["labels"] = {**(meta.get("labels") or {}), **assignment.labels}
    if assignment.annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **assignment.annotations}
    labels = meta.get("labels") or {}
    labels.pop(QUEUE_LABEL, None)  # never queued pod by pod by Kueue's pod integration
    return pod


def _condition(
    type_: str, status: bool, reason: str, message: str, now: str, generation: int | None
) -> dict[str, Any]:
    """A Workload condition as Kueue writes it (``observedGeneration`` only when known)."""
    c: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def release_patch(wl: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """After an eviction, once no pod of the job is left: the status merge-patch that hands
    the quota back (QuotaReserved=False, no admission, Admitted=False, Requeued), as Kueue's
    jobframework does; Kueue then queues the Workload again. None when there is nothing to
    hand back. The patch carries the resourceVersion it was computed from (a conflict is
    retried by the next reconcile)."""
    evicted = _cond(wl, EVICTED)
    if evicted is None or evicted.get("status") != "True":
        return None
    status = wl.get("status") or {}
    if not _true(wl, QUOTA_RESERVED) and not status.get("admission"):
        return None
    reason = str(evicted.get("reason") or "Evicted")
    msg = str(evicted.get("message") or "")
    gen = (wl.get("metadata") or {}).get("generation")
    new = [
        _condition(REQUEUED, reason in _REQUEUE_REASONS, reason, msg, now, gen),
        _condition(QUOTA_RESERVED, False, "Pending", msg, now, gen),
    ]
    if _cond(wl, ADMITTED) is not None:
        new.append(
            _condition(
                ADMITTED, False, "NoReservation", "The workload has no reservation", now, gen
            )
        )
    return {
        "metadata": {"resourceVersion": (wl.get("metadata") or {}).get("resourceVersion")},
        "status": {
            "conditions": set_conditions(status.get("conditions") or [], new),
            "admission": None,
        },
    }


def finish_patch(
    wl: Mapping[str, Any], *, succeeded: bool, message: str, now: str
) -> dict[str, Any] | None:
    """The status merge-patch that marks the Workload Finished (Kueue frees its quota); None
    when it is already."""
    if _true(wl, FINISHED):
        return None
    gen = (wl.get("metadata") or {}).get("generation")
    new = [_condition(FINISHED, True, "Succeeded" if succeeded else "Failed", message, now, gen)]
    return {
        "metadata": {"resourceVersion": (wl.get("metadata") or {}).get("resourceVersion")},
        "status": {
            "conditions": set_conditions((wl.get("status") or {}).get("conditions") or [], new)
        },
    }


__all__ = [
    "ADMITTED",
    "EVICTED",
    "FINISHED",
    "POD_SET",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "QUOTA_RESERVED",
    "WORKLOAD_API",
    "Assignment",
    "Gate",
    "apply_admission",
    "desired_workload",
    "finish_patch",
    "flavor_names",
    "gate_of",
    "matches",
    "owned_by",
    "queue_of",
    "release_patch",
    "workload_name",
]
