"""The only module that talks to the Kubernetes API.

Client errors are wrapped into the operator's own types, so no handler needs
to know the HTTP library. Creates tolerate AlreadyExists and deletes tolerate
NotFound: every action the planner asks for is safe to repeat.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Protocol, cast
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob_operator.torchjob.observed import controller_uid

log = logging.getLogger(__name__)


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


_PATHS: Mapping[str, str] = {
    "pod": "/api/v1/namespaces/{ns}/pods",
    "service": "/api/v1/namespaces/{ns}/services",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "event": "/api/v1/namespaces/{ns}/events",
    "scheduling.x-k8s.io/v1alpha1": "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
    "scheduling.volcano.sh/v1beta1": "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups",
    "Workload": "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads",
}
_KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
"""Where each kind of object the operator creates is POSTed."""


class Kube(Protocol):
    """What the reconciler needs of the API server (``KubeClient``; an in-memory fake in
    ``tests/unit/test_reconcile.py``). Creates are False on AlreadyExists, deletes and
    labels False on NotFound: every action is safe to repeat."""

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_jobs(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]: ...
    def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...
    def delete_job(self, namespace: str, name: str) -> None: ...
    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...
    def create_pod(self, body: dict[str, Any]) -> bool: ...
    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool: ...
    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> bool: ...
    def ensure_service(self, body: dict[str, Any]) -> bool: ...
    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool: ...
    def apply_pod_group(self, body: dict[str, Any]) -> bool: ...
    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_workload(self, body: dict[str, Any]) -> bool: ...
    def delete_workload(self, namespace: str, name: str, uid: str) -> bool: ...
    def patch_workload_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> bool: ...
    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None: ...
    def post_event(
        self, job: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None: ...


class KubeClient:
    """``Kube`` over the kubernetes client."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def _send(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> None:
        """One write with a plain JSON body; what the server returns is read and dropped.

        The generated methods validate a dict body into a model (``V1Pod``) with pydantic,
        serialize it back and parse the answer into a model again: in a burst that was most
        of the operator's CPU (bench/README.md has the profile). Errors raise ``ApiException``
        as the generated methods do."""
        method, url, headers, _, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response: Any = self.api.call_api(method, url, headers, body)
        data = response.read()  # to the end: the connection goes back to the pool
        if not 200 <= response.status <= 299:
            text = data.decode(errors="replace") if isinstance(data, bytes) else None
            raise ApiException.from_response(http_resp=response, body=text, data=None)

    def _get_json(self, path: str) -> dict[str, Any] | None:
        """GET ``path`` as a plain dict; None on NotFound."""
        method, url, headers, _, _ = self.api.param_serialize(
            method="GET",
            resource_path=path,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response: Any = self.api.call_api(method, url, headers)
        data = response.read()
        if response.status == 404:
            return None
        if not 200 <= response.status <= 299:
            text = data.decode(errors="replace") if isinstance(data, bytes) else None
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        return cast(dict[str, Any], json.loads(data))

    def _ensure_owned(self, kind: str, body: dict[str, Any]) -> bool:
        """Create ``body``; False when this job's own copy exists. Raises
        :class:`EarlierOwnerError` when an object of that name belongs to another controller
        (an earlier TorchJob of the same name whose dependents are not collected yet)."""
        for _ in range(2):
            if self._create_once(kind, body):
                return True
            ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
            path = f"{_PATHS[kind].format(ns=quote(ns))}/{quote(name)}"
            try:
                existing = self._get_json(path)
            except ApiException as e:
                raise KubeError("read", f"{kind} {ns}/{name}", e) from e
            if existing is None:
                continue  # collected between the create and the read: create it now
            owner, wanted = controller_uid(existing), controller_uid(body)
            if owner != wanted:
                raise EarlierOwnerError(kind, ns, name, owner)
            return False
        return False

    def _create_once(self, kind: str, body: dict[str, Any]) -> bool:
        """Create a namespaced object; False on AlreadyExists, so a repeated create is harmless."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self._send("POST", _PATHS[kind].format(ns=quote(ns)), body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise KubeError("create", f"{kind} {ns}/{name}", e) from e

    def close_idle_connections(self) -> None:
        """Close the kept-alive connections (the pool opens new ones when asked)."""
        self.api.rest_client.pool_manager.clear()

    # --- TorchJobs ------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return cast(dict[str, Any], obj)
        except ApiException as e:
            if e.status == 404:
                return None
            raise KubeError("get", f"torchjob {namespace}/{name}", e) from e

    def list_jobs(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        """(namespace, name) of every TorchJob in ``namespaces`` (all when empty)."""
        return self.list_keys(PLURAL, namespaces)

    def list_keys(self, plural: str, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        """(namespace, name) of every object of this API group's ``plural`` in ``namespaces``
        (all when empty)."""
        try:
            pages: list[Any] = (
                [
                    self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural)
                    for ns in namespaces
                ]
                if namespaces
                else [self.custom.list_cluster_custom_object(GROUP, VERSION, plural)]
            )
            items = [i for page in pages for i in page["items"]]
        except ApiException as e:
            raise KubeError("list", plural, e) from e
        return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items]

    def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """A merge patch of the status subresource: no resourceVersion, so no conflicts to lose."""
        path = (
            f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}/status"
        )
        try:
            self._send("PATCH", path, {"status": dict(status)}, "application/merge-patch+json")
        except ApiException as e:
            if e.status == 404:
                return
            raise KubeError("patch status of", f"torchjob {namespace}/{name}", e) from e

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise KubeError("delete", f"torchjob {namespace}/{name}", e) from e

    # --- pods and services -------------------------------------------------------------
    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        try:
            resp: Any = self.core.list_namespaced_pod(
                namespace,
                label_selector=f"{contract.LABEL_JOB_NAME}={job}",
                _preload_content=False,
            )
        except ApiException as e:
            raise KubeError("list pods of", f"torchjob {namespace}/{job}", e) from e
        return list(json.loads(resp.data).get("items") or [])

    def create_pod(self, body: dict[str, Any]) -> bool:
        """Create ``body``; False when it already exists (a repeated plan)."""
        return self._create_once("pod", body)

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool:
        """Merge ``labels`` into the pod's; False when the pod is gone."""
        try:
            self._send(
                "PATCH",
                f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
                {"metadata": {"labels": labels}},
                "application/merge-patch+json",
            )
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise KubeError("label", f"pod {namespace}/{name}", e) from e

    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete the pod; with ``uid``, only that pod (a precondition): False when it is
        gone, even if a newer pod of the same name exists (409 Conflict: left alone)."""
        body = (
            {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
            if uid
            else None
        )
        try:
            self._send("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body)
            return True
        except ApiException as e:
            if e.status == 404 or (uid and e.status == 409):
                return False
            raise KubeError("delete", f"pod {namespace}/{name}", e) from e

    def ensure_service(self, body: dict[str, Any]) -> bool:
        """Create the Service ``body``; False when this job's exists already (raises
        :class:`EarlierOwnerError` for an earlier same-named job's)."""
        return self._ensure_owned("service", body)

    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool:
        """Create the worker ServiceAccount, Role or RoleBinding; False when this job's exists
        already (raises :class:`EarlierOwnerError` for an earlier same-named job's)."""
        return self._ensure_owned(kind, body)

    def apply_pod_group(self, body: dict[str, Any]) -> bool:
        """Create the PodGroup ``body`` (its apiVersion says whose); when it exists, set its
        spec (minMember follows the generation). True when created."""
        kind = str(body["apiVersion"])
        if self._create_once(kind, body):
            return True
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self._send(
                "PATCH",
                f"{_PATHS[kind].format(ns=quote(ns))}/{quote(name)}",
                {"spec": body["spec"]},
                content_type="application/merge-patch+json",
            )
        except ApiException as e:
            raise KubeError("patch", f"PodGroup {ns}/{name}", e) from e
        return False

    # --- Kueue (planner/kueue.py) ------------------------------------------------------
    def _workload_path(self, namespace: str, name: str) -> str:
        return f"{_PATHS['Workload'].format(ns=quote(namespace))}/{quote(name)}"

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._get_json(self._workload_path(namespace, name))
        except ApiException as e:
            raise KubeError("read", f"Workload {namespace}/{name}", e) from e

    def create_workload(self, body: dict[str, Any]) -> bool:
        """Create the job's Workload; False when it exists already."""
        return self._create_once("Workload", body)

    def delete_workload(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the Workload whose uid is ``uid`` (never a newer one); False when gone."""
        try:
            self._send(
                "DELETE",
                self._workload_path(namespace, name),
                {"preconditions": {"uid": uid}, "propagationPolicy": "Background"},
            )
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise KubeError("delete", f"Workload {namespace}/{name}", e) from e

    def patch_workload_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """Merge-patch the Workload's status; False on a conflict (the patch carries the
        resourceVersion it was computed from: Kueue wrote meanwhile, the next pass retries)."""
        try:
            self._send(
                "PATCH",
                f"{self._workload_path(namespace, name)}/status",
                dict(patch),
                content_type="application/merge-patch+json",
            )
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise KubeError("patch", f"Workload {namespace}/{name} status", e) from e

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped Kueue object (a ResourceFlavor, a WorkloadPriorityClass)."""
        try:
            return self._get_json(f"{_KUEUE}/{plural}/{quote(name)}")
        except ApiException as e:
            raise KubeError("read", f"{plural}/{name}", e) from e

    # --- events ------------------------------------------------------------------------
    def post_event(
        self, job: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        """A core/v1 Event on the TorchJob (what `kubectl describe tj` shows). Best effort."""
        meta = job.get("metadata") or {}
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {
                "name": f"{meta.get('name')}.{uuid.uuid4().hex[:12]}",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": job.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": job.get("kind", "TorchJob"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._send("POST", _PATHS["event"].format(ns=quote(str(meta.get("namespace")))), body)
        except ApiException as e:
            log.warning("could not post event %s on %s: %s", reason, meta.get("name"), e.reason)
