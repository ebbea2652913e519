"""``CachedKube``: the ``Kube`` protocol over the read cache (``cache.Store``).

Reads come from the store, writes go through to the API server and record what the watches
will show once they have caught up (the expectations ``Store.catching_up`` waits for).
TorchTunes and runtime blueprints are not cached: their reads and writes go straight through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchjob import contract
from torchjob_operator.engine import metrics
from torchjob_operator.engine.cache import PodExpectation, Store
from torchjob_operator.engine.kube import Kube
from torchjob_operator.engine.objects import job_key_of_pod


class CachedKube:
    """``Kube`` that reads from a ``Store`` and writes through to ``live``, recording what
    every write expects the watches to show. Reads go to ``live`` when the cache cannot
    answer: a job no watch event has brought yet, a namespace whose pod watch has not
    listed yet, or a job whose expectations ran out."""

    def __init__(self, live: Kube, store: Store) -> None:
        self.live = live
        self.store = store

    # --- reads ----------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (namespace, name)
        if not self.store.read_live(key, "job"):
            job = self.store.job(key)
            if job is not None:
                return job
            if self.store.is_gone(key):
                return None
        metrics.LIVE_READS.labels(kind="job").inc()
        return self.live.get_job(namespace, name)

    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        key = (namespace, job)
        if not self.store.read_live(key, "pods"):
            pods = self.store.pods_of(key)
            if pods is not None:
                return pods
        metrics.LIVE_READS.labels(kind="pods").inc()
        return self.live.list_worker_pods(namespace, job)

    def list_jobs(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        return self.live.list_jobs(namespaces)

    # --- writes, each with what it expects ---------------------------------------------------
    def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        key = (namespace, name)
        if not self.live.patch_job_status(namespace, name, status):
            # Gone, though the cache held it: its DELETED event never came (kopf lists again
            # after a watch's 410 Gone and reports no deletion in between). Forget it, so
            # that the next reconcile finds it gone and ends its loop. (A job deleted while
            # this reconcile ran, its DELETED event already handled, is no ghost.)
            if self.store.job(key) is not None:
                metrics.GHOSTS_DROPPED.inc()
            self.store.drop_job(key)
            return False
        self.store.expect_status(key, status)
        return True

    def create_pod(self, body: dict[str, Any]) -> bool:
        created = self.live.create_pod(body)  # False: it exists already, so expect it too
        key = job_key_of_pod(body)
        if key is not None:
            generation = (body["metadata"].get("labels") or {}).get(contract.LABEL_GENERATION)
            labels = {contract.LABEL_GENERATION: generation} if generation is not None else {}
            self.store.expect_pods(
                key, [PodExpectation(body["metadata"]["name"], "created", labels)]
            )
        return created

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool:
        labelled = self.live.label_pod(namespace, name, labels)
        self._expect(namespace, PodExpectation(name, "labelled", dict(labels)))
        return labelled

    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> bool:
        deleted = self.live.delete_pod(namespace, name, uid)
        self._expect(namespace, PodExpectation(name, "deleted"))
        return deleted

    def _expect(self, namespace: str, expectation: PodExpectation) -> None:
        # A pod the cache does not hold shows nothing that could mislead a plan.
        key = self.store.job_of_pod(namespace, expectation.name)
        if key is not None:
            self.store.expect_pods(key, [expectation])

    # --- the rest goes straight through ----------------------------------------------------
    def delete_job(self, namespace: str, name: str) -> None:
        self.live.delete_job(namespace, name)

    def create_job(self, body: dict[str, Any]) -> bool:
        return self.live.create_job(body)

    def suspend_job(self, namespace: str, name: str) -> bool:
        return self.live.suspend_job(namespace, name)

    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        # Read once per job (then pinned in its status), or while it waits for one.
        return self.live.get_runtime(kind, namespace, name)

    def get_tune(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.live.get_tune(namespace, name)

    def list_tunes(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        return self.live.list_tunes(namespaces)

    def patch_tune_status(
        self, namespace: str, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> bool:
        return self.live.patch_tune_status(namespace, name, resource_version, status)

    def ensure_service(self, body: dict[str, Any]) -> bool:
        return self.live.ensure_service(body)

    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool:
        return self.live.ensure_rbac_object(kind, body)

    def apply_pod_group(self, body: dict[str, Any]) -> bool:
        return self.live.apply_pod_group(body)

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.live.get_workload(namespace, name)

    def create_workload(self, body: dict[str, Any]) -> bool:
        return self.live.create_workload(body)

    def delete_workload(self, namespace: str, name: str, uid: str) -> bool:
        return self.live.delete_workload(namespace, name, uid)

    def patch_workload_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        return self.live.patch_workload_status(namespace, name, patch)

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.live.get_kueue_object(plural, name)

    def node_labels(self, label_selector: str) -> dict[str, dict[str, str]]:
        return self.live.node_labels(label_selector)

    def post_event(
        self, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        self.live.post_event(obj, type_=type_, reason=reason, message=message, component=component)
