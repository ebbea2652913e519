"""The ``Kube`` protocol: every call the operator's controllers make to the API server,
and the errors they see. ``client.KubeClient`` implements it over the kubernetes client,
``cache.CachedKube`` over the read cache; a test implements it in memory.

Client errors are wrapped into the operator's own types, so no controller needs to know
the HTTP library. Creates tolerate AlreadyExists and deletes tolerate NotFound: every
action a controller asks for is safe to repeat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException


def _status_message(body: object) -> str:
    """The ``message`` of a metav1.Status body, or the body itself."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return str(parsed.get("message", text)) if isinstance(parsed, dict) else text


def _status_causes(body: object) -> set[str]:
    """The ``details.causes[].reason`` of a metav1.Status body (empty when there are none)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        return set()
    details = parsed.get("details") if isinstance(parsed, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return {str(c.get("reason")) for c in causes or [] if isinstance(c, dict)}


class KubeError(Exception):
    """An API call failed: ``<verb> <object>: <status> <reason>: <message>``."""

    def __init__(self, verb: str, target: str, exc: ApiException) -> None:
        self.status = exc.status
        self.reason = exc.reason
        self.body = exc.body
        self.detail = _status_message(exc.body)
        super().__init__(f"{verb} {target}: {exc.status} {exc.reason}: {self.detail}")

    @property
    def namespace_terminating(self) -> bool:
        """403 NamespaceTerminating: the namespace is being deleted and takes the job with it.
        No create there can succeed, and none needs to: not an error of the operator's."""
        return self.status == 403 and "NamespaceTerminating" in _status_causes(self.body)

    @property
    def permanent(self) -> bool:
        """4xx other than conflict/too-many-requests: retrying the same request cannot help."""
        return (
            self.status is not None and 400 <= self.status < 500 and self.status not in (409, 429)
        )


class EarlierOwnerError(Exception):
    """An object the job needs exists under its name with another controller: an earlier
    TorchJob of the same name was deleted and the garbage collector has not removed its
    dependents yet. Not an error to report: the job waits until the object is gone."""

    def __init__(self, kind: str, namespace: str, name: str, owner_uid: str | None) -> None:
        self.kind, self.namespace, self.name, self.owner_uid = kind, namespace, name, owner_uid
        super().__init__(f"{kind} {namespace}/{name} belongs to another owner ({owner_uid})")


class Kube(Protocol):
    """What the controllers need of the API server (``client.KubeClient``; an in-memory fake
    in ``tests/unit/test_reconcile.py``). Creates are False on AlreadyExists, deletes and
    labels False on NotFound: every action is safe to repeat."""

    # --- TorchJobs ----------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_jobs(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]: ...
    def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """False: the TorchJob is gone (NotFound)."""
        ...

    def create_job(self, body: dict[str, Any]) -> bool: ...
    def suspend_job(self, namespace: str, name: str) -> bool: ...
    def delete_job(self, namespace: str, name: str) -> None: ...
    # --- runtime blueprints (spec.runtimeRef) ----------------------------------------------
    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    # --- TorchTunes ---------------------------------------------------------------------
    def get_tune(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_tunes(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]: ...
    def patch_tune_status(
        self, namespace: str, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> bool: ...
    # --- pods and the objects a job's pods need -------------------------------------------
    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...
    def create_pod(self, body: dict[str, Any]) -> bool: ...
    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool: ...
    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> bool: ...
    def ensure_service(self, body: dict[str, Any]) -> bool: ...
    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool: ...
    def apply_pod_group(self, body: dict[str, Any]) -> bool: ...
    # --- Kueue --------------------------------------------------------------------------
    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_workload(self, body: dict[str, Any]) -> bool: ...
    def delete_workload(self, namespace: str, name: str, uid: str) -> bool: ...
    def patch_workload_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> bool: ...
    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None: ...
    def node_labels(self, label_selector: str) -> dict[str, dict[str, str]]: ...
    # --- Events -------------------------------------------------------------------------
    def post_event(
        self, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None: ...
