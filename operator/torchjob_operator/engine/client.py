"""``KubeClient``: the ``Kube`` protocol over the kubernetes client, the only module that
talks to the Kubernetes API for the controllers (the pod watch and the leader election hold
their own connections)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, cast
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob.api.runtimes import CLUSTER_KIND, CLUSTER_PLURAL
from torchjob.api.runtimes import PLURAL as RUNTIME_PLURAL
from torchjob.api.torchtune import PLURAL as TUNE_PLURAL
from torchjob_operator.common.owners import controller_uid
from torchjob_operator.engine import metrics
from torchjob_operator.engine.kube import EarlierOwnerError, KubeError

log = logging.getLogger(__name__)

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
    "TorchJob": f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}",
}
_KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
"""Where each kind of object the operator creates is POSTed."""


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
            metrics.API_ERRORS.labels(verb=method, code=str(response.status)).inc()
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
            metrics.API_ERRORS.labels(verb="GET", code=str(response.status)).inc()
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

    def _merge_patch(
        self, path: str, body: Mapping[str, Any], verb: str, target: str, gone: tuple[int, ...]
    ) -> bool:
        """One JSON merge patch; False when the server answers one of the ``gone`` statuses
        (404 NotFound, and 409 Conflict for a patch guarded by a resourceVersion)."""
        try:
            self._send("PATCH", path, dict(body), "application/merge-patch+json")
            return True
        except ApiException as e:
            if e.status in gone:
                return False
            raise KubeError(verb, target, e) from e

    def close_idle_connections(self) -> None:
        """Close the kept-alive connections (the pool opens new ones when asked)."""
        self.api.rest_client.pool_manager.clear()

    # --- TorchJobs ------------------------------------------------------------------
    def _get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object of this API group; None on NotFound."""
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
            return cast(dict[str, Any], obj)
        except ApiException as e:
            if e.status == 404:
                return None
            raise KubeError("get", f"{plural} {namespace}/{name}", e) from e

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_custom(PLURAL, namespace, name)

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

    def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """A merge patch of the status subresource: no resourceVersion, so no conflicts to
        lose. False when the job is gone."""
        path = (
            f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}/status"
        )
        target = f"torchjob {namespace}/{name}"
        return self._merge_patch(path, {"status": dict(status)}, "patch status of", target, (404,))

    def create_job(self, body: dict[str, Any]) -> bool:
        """Create the TorchJob ``body`` (a study's trial); False when it exists already."""
        return self._create_once("TorchJob", body)

    def suspend_job(self, namespace: str, name: str) -> bool:
        """Set ``spec.runPolicy.suspend``; False when the TorchJob is gone."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}"
        body = {"spec": {"runPolicy": {"suspend": True}}}
        return self._merge_patch(path, body, "suspend", f"torchjob {namespace}/{name}", (404,))

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise KubeError("delete", f"torchjob {namespace}/{name}", e) from e

    # --- runtime blueprints ----------------------------------------------------------------
    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A ClusterTorchRuntime, or a TorchRuntime of ``namespace``; None on NotFound."""
        if kind != CLUSTER_KIND:
            return self._get_custom(RUNTIME_PLURAL, namespace, name)
        try:
            obj = self.custom.get_cluster_custom_object(GROUP, VERSION, CLUSTER_PLURAL, name)
            return cast(dict[str, Any], obj)
        except ApiException as e:
            if e.status == 404:
                return None
            raise KubeError("get", f"{CLUSTER_PLURAL} {name}", e) from e

    # --- TorchTunes -----------------------------------------------------------------------
    def get_tune(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_custom(TUNE_PLURAL, namespace, name)

    def list_tunes(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        """(namespace, name) of every TorchTune in ``namespaces`` (all when empty)."""
        return self.list_keys(TUNE_PLURAL, namespaces)

    def patch_tune_status(
        self, namespace: str, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch the status, guarded by the resourceVersion the study was read at (a
        stale read loses with a 409 instead of overwriting a newer record): False on that
        conflict, or when the TorchTune is gone."""
        path = (
            f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{TUNE_PLURAL}/"
            f"{quote(name)}/status"
        )
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        target = f"torchtune {namespace}/{name}"
        return self._merge_patch(path, body, "patch status of", target, (404, 409))

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
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        body = {"metadata": {"labels": labels}}
        return self._merge_patch(path, body, "label", f"pod {namespace}/{name}", (404,))

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
        path = f"{_PATHS[kind].format(ns=quote(ns))}/{quote(name)}"
        self._merge_patch(path, {"spec": body["spec"]}, "patch", f"PodGroup {ns}/{name}", ())
        return False

    # --- Kueue (torchjob/kueue.py) ------------------------------------------------------
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
        path = f"{self._workload_path(namespace, name)}/status"
        target = f"Workload {namespace}/{name} status"
        return self._merge_patch(path, patch, "patch", target, (404, 409))

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped Kueue object (a ResourceFlavor, a WorkloadPriorityClass)."""
        try:
            return self._get_json(f"{_KUEUE}/{plural}/{quote(name)}")
        except ApiException as e:
            raise KubeError("read", f"{plural}/{name}", e) from e

    def node_labels(self, label_selector: str) -> dict[str, dict[str, str]]:
        """The labels of the nodes ``label_selector`` selects, by node name (a Kueue
        admission's hosts, to place them in the levels of its Topology)."""
        try:
            resp: Any = self.core.list_node(label_selector=label_selector, _preload_content=False)
        except ApiException as e:
            raise KubeError("list", "nodes", e) from e
        return {
            str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
            for n in json.loads(resp.data).get("items") or []
        }

    # --- events ------------------------------------------------------------------------
    def post_event(
        self, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        """A core/v1 Event on ``obj``, a TorchJob or a TorchTune (what `kubectl describe`
        shows). Best effort."""
        meta = obj.get("metadata") or {}
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {
                "name": f"{meta.get('name')}.{uuid.uuid4().hex[:12]}",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": obj.get("kind", "TorchJob"),
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
