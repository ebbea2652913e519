"""Workers write only what they own (issue 41): the chart's ValidatingAdmissionPolicy on the
real API server, driven with a worker's own token.

The job's ServiceAccount, Role and RoleBinding come from the operator's builder
(``resources/rbac.py``), the policy from the chart's one source (``resources/worker_policy.py``),
the token from the TokenRequest API, as a kubelet mounts it. The runtime's own writers
(``JobStatusReporter``, ``RunTracking``, ``SilentReports``) must pass; a write of the phase,
the counters, the conditions is refused with the policy's message. A second test widens the
worker's RBAC (what a platform team might grant by mistake) to show that the policy, not the
Role alone, keeps the spec, the labels, the replica count and the job itself.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION, TorchJobStatus
from torchjob.train.job_status import JobEndpoint, JobStatusReporter, progress_body
from torchjob.train.recovery.reports import SilentReports
from torchjob.train.tracking import RunTracking
from torchjob_operator.resources.rbac import worker_rbac
from torchjob_operator.resources.worker_policy import POLICY_NAME, worker_policy_manifests

pytestmark = pytest.mark.cluster

JOB = "tj"
REFUSED = "its worker ServiceAccount may change only status.progress, status.tracking and"
POLICY = f"ValidatingAdmissionPolicy '{POLICY_NAME}'"


@pytest.fixture(scope="module")
def worker_policy(
    cluster: k.Cluster, crd: None, stop_process_operators: Callable[[], None]
) -> Iterator[None]:
    """The policy and its binding, as the chart installs them; removed after the module.

    No operator runs meanwhile: these jobs stand for one the operator reconciles, with the
    status and the worker RBAC it would write, written here (an operator left running by an
    earlier test would create the same account first and overwrite the status under test).
    The ``jobs`` fixture starts it again for a later test."""
    stop_process_operators()
    api = client.AdmissionregistrationV1Api(cluster.api_client())
    # apply, not create: an interrupted run may have left an older version
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(worker_policy_manifests()))
    try:
        yield
    finally:
        api.delete_validating_admission_policy_binding(POLICY_NAME)
        api.delete_validating_admission_policy(POLICY_NAME)


@dataclass
class Worker:
    """Requests to the API server as the job's worker ServiceAccount (its bearer token)."""

    server: str
    token: str
    ca: Path
    namespace: str

    def job_path(self, sub: str = "") -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{JOB}"
        return f"{path}/{sub}" if sub else path

    def send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content_type: str = "application/merge-patch+json",
        query: str = "",
    ) -> tuple[int, str]:
        """(HTTP status, the server's message); never raises on an HTTP error."""
        url = f"{self.server}{path}{'?' + query if query else ''}"
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return response.status, ""
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}").get("message", "")

    def endpoint(self, sa_dir: Path) -> JobEndpoint:
        """The runtime's own client of its job's status, on this token (as a pod mounts it)."""
        sa_dir.mkdir(parents=True, exist_ok=True)
        (sa_dir / "token").write_text(self.token)
        (sa_dir / "ca.crt").write_bytes(self.ca.read_bytes())
        return JobEndpoint(
            api_url=self.server, serviceaccount_dir=sa_dir, namespace=self.namespace, name=JOB
        )


def operator_status() -> dict[str, Any]:
    """A running job's status as the operator writes it: what a worker must not touch."""
    return TorchJobStatus.model_validate(
        {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Running",
                    "message": "2/2 workers ready",
                    "lastTransitionTime": "2026-11-28T00:00:00Z",
                }
            ],
            "replicas": 2,
            "currentGeneration": 1,
            "restarts": 1,
            "disruptions": 2,
        }
    ).to_patch()


@pytest.fixture
def worker(
    cluster: k.Cluster, kube: Any, namespace: str, worker_policy: None, tmp_path: Path
) -> Worker:
    """A running TorchJob with the operator's worker account, and a token of that account."""
    custom, core, rbac = (
        client.CustomObjectsApi(kube),
        client.CoreV1Api(kube),
        client.RbacAuthorizationV1Api(kube),
    )
    job = custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TorchJob",
            "metadata": {"name": JOB, "labels": {"team": "a"}},
            "spec": {
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "trainer", "image": "pause"}]}},
            },
        },
    )
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, JOB, {"status": operator_status()}
    )
    create = {
        "ServiceAccount": core.create_namespaced_service_account,
        "Role": rbac.create_namespaced_role,
        "RoleBinding": rbac.create_namespaced_role_binding,
    }
    for kind, manifest in worker_rbac(name=JOB, namespace=namespace, uid=job["metadata"]["uid"]):
        create[kind](namespace, manifest)
    token = core.create_namespaced_service_account_token(
        contract.worker_service_account(JOB), namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    conf = kube.configuration
    return Worker(conf.host, token, Path(conf.ssl_ca_cert), namespace)


def wait_refused(worker: Worker, path: str, body: dict[str, Any], what: str) -> None:
    """Until a dry-run of a write the policy refuses is refused by it: the API server's
    admission plugin sees a new policy (and the authorizer a new Role) once its informers
    have synced. A dry run changes nothing whether it passes or not."""

    def refused() -> bool:
        code, message = worker.send("PATCH", path, body, query="dryRun=All")
        return code == 403 and POLICY in message

    k.wait_for(refused, 60, what, interval=0.2)


def job_of(kube: Any, namespace: str) -> dict[str, Any]:
    job: dict[str, Any] = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, JOB
    )
    return job


def test_a_worker_writes_its_progress_but_never_the_operators_status(
    worker: Worker, kube: Any, tmp_path: Path
) -> None:
    ns, status = worker.namespace, worker.job_path("status")
    wait_refused(worker, status, {"status": {"phase": "Succeeded"}}, "the worker policy active")

    # The runtime's own writes, on the worker's token: progress, tracking, a silent peer.
    endpoint = worker.endpoint(tmp_path / "sa")
    reporter = JobStatusReporter(endpoint, min_interval_s=0)
    reporter.report(progress_body({"epoch": 2, "loss": 0.5}, reports=7, checkpoint="ckpt_000007"))
    reporter.close()
    assert reporter.sent == 1
    tracking = RunTracking(
        None, name=JOB, run_url=str(tmp_path / "run"), config=None, pod=None, endpoint=endpoint
    )
    tracking.trial.tracking["mlflow_run_id"] = "run-41"
    tracking._publish()
    # Each survivor applies its own silent-peer reports (a server-side apply of a list map).
    for index, silent in ((0, 1), (1, 0)):
        pod = contract.PodEnv(
            job_name=JOB, namespace=ns, pod_index=index, replicas=2, nproc_per_node=1,
            generation=1, rdzv_host="h", membership=contract.KEEP_SURVIVORS,
        )  # fmt: skip
        reports = SilentReports(endpoint, pod)
        assert reports.record((0, 1), 1, silent, 12.5)
        reports.write()  # raises when refused
    both = job_of(kube, ns)["status"]["silentWorkers"]
    assert {(r["by"], r["pod"]) for r in both} == {
        ("tj-worker-0", "tj-worker-1"),
        ("tj-worker-1", "tj-worker-0"),
    }
    # However the list is written: a JSON merge patch of it (an older runtime's) passes too.
    older = {"pod": "tj-worker-1", "generation": 1, "by": "tj-worker-0", "seconds": 3.0}
    code, message = worker.send("PATCH", status, {"status": {"silentWorkers": [older]}})
    assert code == 200, message
    after = job_of(kube, ns)["status"]
    assert after["progress"]["step"] == 7 and after["progress"]["metrics"]["loss"] == 0.5
    assert after["progress"]["lastCheckpoint"] == "ckpt_000007"
    assert after["tracking"]["runId"] == "run-41"
    assert after["silentWorkers"] == [older]

    # The operator's fields: each write is refused, and the message names what.
    condition = {**operator_status()["conditions"][0], "status": "False", "reason": "Failed"}
    for change, named in [
        ({"phase": "Succeeded"}, ["refused: status.phase"]),
        ({"restarts": 0}, ["refused: status.restarts"]),
        ({"disruptions": 0, "currentGeneration": 9}, ["status.disruptions", "currentGeneration"]),
        ({"conditions": [condition]}, ["refused: status.conditions"]),
        ({"conditions": None}, ["refused: status.conditions"]),
        ({"progress": {"step": 8}, "phase": "Failed"}, ["refused: status.phase"]),
    ]:
        code, message = worker.send("PATCH", status, {"status": change})
        assert code == 403, (change, message)
        assert POLICY in message and REFUSED in message, message
        assert all(n in message for n in named), message
        assert "progress" not in message.split("refused: ", 1)[1], message  # its own field
    unchanged = job_of(kube, ns)["status"]
    assert TorchJobStatus.parse(unchanged).to_patch() == operator_status()
    assert unchanged["progress"]["step"] == 7  # the refused write moved nothing at all
    # The Role grants nothing beyond the status: the spec and the labels are RBAC's refusal.
    code, message = worker.send("PATCH", worker.job_path(), {"spec": {"replicas": 4}})
    assert code == 403 and "cannot patch resource" in message, message
    # Anyone else (here the admin; in a cluster the operator) is not confined by the policy.
    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, JOB, {"status": {"phase": "Succeeded"}}
    )
    assert job_of(kube, ns)["status"]["phase"] == "Succeeded"


def test_widened_worker_rbac_still_cannot_touch_the_spec_labels_scale_or_the_job(
    worker: Worker, kube: Any
) -> None:
    ns = worker.namespace
    account = contract.worker_service_account(JOB)
    wide = f"{account}-too-wide"
    rbac = client.RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": wide},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": [PLURAL, f"{PLURAL}/scale"],
                    "resourceNames": [JOB],
                    "verbs": ["get", "patch", "update", "delete"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": wide},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": wide},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
        },
    )
    spec = {"spec": {"replicas": 4}}
    wait_refused(worker, worker.job_path(), spec, "the widened Role and the policy active")
    for path, body, named in [
        (worker.job_path(), spec, "refused: spec"),
        (worker.job_path(), {"metadata": {"labels": {"team": "b"}}}, "refused: metadata.labels"),
        (worker.job_path(), {"metadata": {"annotations": {"a": "b"}}}, "metadata.annotations"),
        (worker.job_path(), {"metadata": {"finalizers": ["x.io/keep"]}}, "metadata.finalizers"),
        (worker.job_path("scale"), spec, "refused: spec"),
    ]:
        code, message = worker.send("PATCH", path, body)
        assert code == 403 and POLICY in message and named in message, (body, message)
    code, message = worker.send("DELETE", worker.job_path())
    assert code == 403 and "its worker ServiceAccount may not delete it" in message, message
    job = job_of(kube, ns)
    assert job["spec"]["replicas"] == 2 and job["metadata"]["labels"] == {"team": "a"}
    assert not job["metadata"].get("annotations") and not job["metadata"].get("finalizers")


def test_a_templates_own_account_is_confined_by_the_worker_pod_its_token_is_bound_to(
    worker: Worker, kube: Any
) -> None:
    """A template that names its own ``serviceAccountName`` (cloud storage credentials) runs
    its workers as that account, which the user grants the worker Role's rules: the policy
    finds it by the worker pod its kubelet-mounted token is bound to."""
    ns, status = worker.namespace, worker.job_path("status")
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    own = "storage-reader"
    core.create_namespaced_service_account(ns, {"metadata": {"name": own}})
    _, role = worker_rbac(name=JOB, namespace=ns, uid="unused")[1]
    rbac.create_namespaced_role(ns, {"metadata": {"name": own}, "rules": role["rules"]})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": own},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": own},
            "subjects": [{"kind": "ServiceAccount", "name": own, "namespace": ns}],
        },
    )
    pod = k.pod_manifest(contract.worker_pod_name(JOB, 1))
    pod["spec"]["serviceAccountName"] = own
    created = k.wait_for(
        lambda: _create_pod(core, ns, pod), 30, f"pod of ServiceAccount {own} admitted"
    )

    def token(bound: dict[str, str] | None) -> Worker:
        spec: dict[str, Any] = {"expirationSeconds": 3600}
        if bound:
            spec["boundObjectRef"] = bound
        minted = core.create_namespaced_service_account_token(own, ns, {"spec": spec})
        return Worker(worker.server, minted.status.token, worker.ca, ns)

    bound = token({"apiVersion": "v1", "kind": "Pod", **created})
    wait_refused(bound, status, {"status": {"phase": "Succeeded"}}, "the bound token refused")
    code, message = bound.send("PATCH", status, {"status": {"restarts": 0}})
    assert code == 403 and "refused: status.restarts" in message, message
    code, message = bound.send("PATCH", status, {"status": {"progress": {"step": 3}}})
    assert code == 200, message
    # The limit, stated in docs/operations.md: the same account's token not bound to a worker
    # pod (minted by hand, a legacy Secret) is not matched; its grant is the user's to keep.
    code, message = token(None).send(
        "PATCH", status, {"status": {"phase": "Succeeded"}}, query="dryRun=All"
    )
    assert code == 200, message


def _create_pod(core: Any, namespace: str, pod: dict[str, Any]) -> dict[str, str] | None:
    """The pod's name and uid once created; None while the ServiceAccount admission plugin
    has not seen the new account yet."""
    try:
        made = core.create_namespaced_pod(namespace, pod)
    except client.ApiException as err:
        if err.status == 403 and "serviceaccount" in str(err.body).lower():
            return None
        raise
    return {"name": made.metadata.name, "uid": made.metadata.uid}
