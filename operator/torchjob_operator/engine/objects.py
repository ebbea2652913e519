"""Pure helpers over Kubernetes objects as the watches deliver them (plain dicts): what the
read cache keeps of a pod or a TorchJob (client-go's ``TransformFunc``), the job a pod
belongs to, and whether an object already shows a merge patch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchjob import contract
from torchjob_operator.common.nodes import AVOIDED_NODES
from torchjob_operator.common.owners import controller_uid

JobKey = tuple[str, str]
"""(namespace, name) of a TorchJob."""

Pod = dict[str, Any]

_OUR_LABELS = f"{contract.GROUP}/"
"""The prefix of torchjob's own labels (``torchjob.io/``): the only labels the planner reads."""


_READ_CONDITIONS = frozenset({"Ready", "PodScheduled", "DisruptionTarget", "TerminationTarget"})
_CONDITION_KEYS = ("type", "status", "reason", "message", "lastTransitionTime")


def _trim_container_status(cs: Mapping[str, Any]) -> dict[str, Any]:
    state = cs.get("state") or {}
    last = cs.get("lastState") or {}
    out: dict[str, Any] = {}
    kept = {k: state[k] for k in ("terminated", "waiting") if k in state}
    if kept:
        out["state"] = kept
    if "terminated" in last:
        out["lastState"] = {"terminated": last["terminated"]}
    return out


def trim_pod(pod: Mapping[str, Any]) -> Pod:
    """The part of a pod that ``torchjob.observed`` reads, and nothing else: no
    ``managedFields``, no containers, only torchjob's labels (and its avoided nodes) and the
    controller's uid, only the conditions and
    container states it judges. 8000 pods took 42 MiB of the cache with the whole status,
    19 MiB trimmed, 4 MiB trimmed and kept as JSON bytes (``Store``)."""
    meta = pod.get("metadata") or {}
    # The uid: deletes carry it as a precondition, so a plan never deletes a newer same-named pod.
    kept_meta: dict[str, Any] = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(_OUR_LABELS)}
    if labels:
        kept_meta["labels"] = labels
    # creationTimestamp: with the Ready condition's time, how long a replacement took to
    # start (``PodView.start_s``, the replacement lead of ``torchjob/drain.py``).
    for key in ("creationTimestamp", "deletionTimestamp"):
        if meta.get(key):
            kept_meta[key] = meta[key]
    avoided = (meta.get("annotations") or {}).get(AVOIDED_NODES)
    if avoided:  # a pod kept off nodes: made again once it may use one (``torchjob/nodes.py``)
        kept_meta["annotations"] = {AVOIDED_NODES: avoided}
    # Only the controller's uid: a same-named earlier job's pods are told apart by it.
    owner = controller_uid(pod)
    if owner is not None:
        kept_meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    status = pod.get("status") or {}
    kept_status: dict[str, Any] = {
        k: status[k] for k in ("phase", "reason", "message") if status.get(k)
    }
    conditions = [
        {k: c[k] for k in _CONDITION_KEYS if c.get(k) is not None}
        for c in status.get("conditions") or ()
        if c.get("type") in _READ_CONDITIONS
    ]
    if conditions:
        kept_status["conditions"] = conditions
    for key in ("initContainerStatuses", "containerStatuses"):
        if status.get(key):
            kept_status[key] = [_trim_container_status(cs) for cs in status[key]]
    spec = pod.get("spec") or {}
    # restartPolicy: a Never pod whose containers all ended has ended (``pod_view``).
    kept_spec = {k: spec[k] for k in ("nodeName", "restartPolicy") if spec.get(k)}
    return {"metadata": kept_meta, "spec": kept_spec, "status": kept_status}


def trim_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """A TorchJob without ``managedFields`` (as large as its spec, and never read)."""
    meta = {k: v for k, v in (job.get("metadata") or {}).items() if k != "managedFields"}
    return {**job, "metadata": meta}


def job_key_of_pod(pod: Mapping[str, Any]) -> JobKey | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME)
    return (str(meta.get("namespace") or ""), str(job)) if job else None


def merge_applied(current: Mapping[str, Any] | None, patch: Mapping[str, Any]) -> bool:
    """Whether ``current`` already shows the JSON merge patch ``patch`` (RFC 7386): every
    null is absent, every object matches recursively, every other value is equal."""
    cur = current or {}
    for key, want in patch.items():
        have = cur.get(key)
        if want is None:
            if have is not None:
                return False
        elif isinstance(want, Mapping):
            if not isinstance(have, Mapping) or not merge_applied(have, want):
                return False
        elif have != want:
            return False
    return True
