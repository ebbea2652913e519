"""The operator's pod watch: only the pods it owns, selected by the API server.

kopf filters pods by label on the client side, after receiving and parsing every
pod in the cluster: on a cluster shared with other workloads the operator paid
CPU for pods that were never its own. This watch asks the API server for pods
carrying the job-name label only (``labelSelector=torchjob.io/job-name``), reads
each event as raw JSON (orjson, no model objects: five times faster than ``json`` on
a pod event, and every pod brings several), keeps the pod in the operator's
``cache.Store`` and reports the job it belongs to.

The loop is ``engine.reflector``'s (one thread per watched namespace, LIST then WATCH,
LIST again on 410 Gone); a LIST replaces the cache's pods of that scope. Every pod event
calls ``on_job(namespace, job)``; the reconciler coalesces them. ``WorkloadWatch`` does the
same for Kueue's Workloads, which may not be installed at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from torchjob import contract
from torchjob_operator.engine import metrics
from torchjob_operator.engine.cache import ALL_NAMESPACES, Store
from torchjob_operator.engine.objects import trim_pod
from torchjob_operator.engine.reflector import Reflector

OnJob = Callable[[str, str], None]

KUEUE_WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")


def job_of(event: dict[str, Any]) -> tuple[str, str] | None:
    """(namespace, job name) of a watch event's pod; None for bookmarks and foreign pods."""
    meta = (event.get("object") or {}).get("metadata") or {}
    job = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME)
    if event.get("type") == "BOOKMARK" or not job:
        return None
    return str(meta.get("namespace") or ""), str(job)


def owner_job(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(namespace, TorchJob) that controls ``obj`` (a Workload), if one does."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "TorchJob":
            return str(meta.get("namespace") or ""), str(ref.get("name"))
    return None


class PodWatch(Reflector):
    """Watches the operator's pods in ``namespaces`` (empty: cluster-wide) on threads."""

    what = "pods"

    def __init__(self, api: client.ApiClient, on_job: OnJob, store: Store, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.core = client.CoreV1Api(api)
        self.on_job = on_job
        self.store = store

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        kwargs["label_selector"] = contract.LABEL_JOB_NAME
        if namespace is None:
            return self.core.list_pod_for_all_namespaces(**kwargs)
        return self.core.list_namespaced_pod(namespace, **kwargs)

    def trim(self, obj: dict[str, Any]) -> dict[str, Any]:
        # Each page trimmed as it comes: thousands of whole pods parsed at once would grow
        # the heap for good.
        return trim_pod(obj)

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """The cache's pods of the scope replaced; every job they (or the cache) had poked."""
        scope = ALL_NAMESPACES if namespace is None else namespace
        for key in self.store.replace_pods(scope, items):
            self.on_job(*key)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        key = job_of({"type": kind, "object": obj})
        if key is None:
            return
        metrics.POD_EVENTS.inc()
        if kind == "DELETED":
            self.store.drop_pod(obj)
        else:
            self.store.put_pod(obj)
        self.on_job(*key)


class WorkloadWatch(Reflector):
    """Kueue's Workloads: a change of one a TorchJob owns (admitted, evicted, its topology
    assigned) makes that job plan again. Kueue may be absent, installed later or removed
    while the operator runs (the reflector looks for it again)."""

    what = "Kueue Workloads"

    def __init__(self, api: client.ApiClient, on_job: OnJob, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.custom = client.CustomObjectsApi(api)
        self.on_job = on_job

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        if namespace is None:
            return self.custom.list_cluster_custom_object(*KUEUE_WORKLOADS, **kwargs)
        return self.custom.list_namespaced_custom_object(
            KUEUE_WORKLOADS[0], KUEUE_WORKLOADS[1], namespace, KUEUE_WORKLOADS[2], **kwargs
        )

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        for key in {k for k in map(owner_job, items) if k is not None}:
            self.on_job(*key)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        key = owner_job(obj)
        if key is not None:
            self.on_job(*key)
