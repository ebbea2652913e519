"""``spec.managedBy`` and MultiKueue (issue 42): real Kueue v0.15 on two control planes.

* the manager is the session cluster: Kueue with MultiKueue's generic adapter for TorchJob
  (``multiKueue.externalFrameworks``), a ClusterQueue with a MultiKueue AdmissionCheck whose
  MultiKueueCluster is the worker; the session's operator there only makes the Workload of a
  ``managedBy: kueue.x-k8s.io/multikueue`` job (the part Kueue's jobframework plays for a
  batch Job), no pod and no status;
* the worker is a second control plane (its own ``TORCHJOB_CLUSTER_NAME``) with its own Kueue,
  a plain ClusterQueue and the operator, which runs the copy MultiKueue creates there through
  the Workload MultiKueue made (``kueue.x-k8s.io/prebuilt-workload-name``).

Also: a job another controller manages is left alone by the operator, and the field is
immutable. Never skipped: if Kueue is not built or cannot start, the tests fail saying why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k
from tests.cluster.kueue_harness import (
    KUEUE,
    KueueProcess,
    create_kueue_object,
    remove_queue,
    running_kueue,
)
from tests.cluster.operator_harness import (
    CRD_FILE,
    RUNTIME_CRD_FILES,
    TUNE_CRD_FILE,
    Jobs,
    OperatorProcess,
    torchjob,
)

pytestmark = pytest.mark.cluster

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGER_KUEUE = {
    "multiKueue": {
        "externalFrameworks": [{"name": "TorchJob.v1alpha1.torchjob.io"}],
        "gcInterval": "10s",
    }
}


@dataclass
class Worker:
    cluster: k.Cluster
    api: Any
    kueue: KueueProcess
    operator: OperatorProcess


def _cluster_sh(verb: str, name: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TORCHJOB_CLUSTER_NAME": name,
        "TORCHJOB_GPU_NODES": "0",
        "TORCHJOB_CPU_NODES": "1",
    }
    return subprocess.run(
        ["bash", str(k.CLUSTER_SH), verb], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def worker(cluster: k.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A second control plane, named after the session's, with Kueue and the operator."""
    if os.environ.get("TORCHJOB_E2E_KIND_KUBECONFIG"):
        pytest.skip("hack/e2e-kind.sh's session has one cluster; this test makes a second")
    name = f"{cluster.kubeconfig.parent.name}-mkw"
    up = _cluster_sh("up", name)
    if up.returncode != 0:
        _cluster_sh("down", name)
        pytest.fail(f"the worker cluster {name} did not start:\n{up.stderr}", pytrace=False)
    wc = k.Cluster(Path(up.stdout.strip().splitlines()[-1]), started_here=True, name=name)
    work = tmp_path_factory.mktemp("worker")
    kueue = KueueProcess(wc, work)
    op = OperatorProcess(wc, work, tag="-worker")
    api = wc.api_client()
    try:
        for path in (CRD_FILE, TUNE_CRD_FILE, *RUNTIME_CRD_FILES):
            wc.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        wc.kubectl(
            "wait", "--for=condition=Established", f"--timeout={k.scaled(60):.0f}s",
            "crd/torchjobs.torchjob.io", "crd/torchtunes.torchjob.io",
        )  # fmt: skip
        kueue.start()
        op.start()
        yield Worker(wc, api, kueue, op)
    finally:
        op.stop()
        kueue.end()
        api.close()
        _cluster_sh("down", name)


def _flavor_and_queue(custom: Any, namespace: str, checks: list[str]) -> None:
    """ResourceFlavor ``<ns>-flavor``, ClusterQueue ``<ns>-cq`` (2 CPUs, ``checks``) and
    LocalQueue ``lq`` in ``namespace``, on whichever cluster ``custom`` speaks to."""
    api = "/".join(KUEUE)
    create_kueue_object(
        custom,
        "resourceflavors",
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": f"{namespace}-flavor"}},
    )
    quota = [{"name": "cpu", "nominalQuota": "2"}, {"name": "memory", "nominalQuota": "4Gi"}]
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": f"{namespace}-flavor", "resources": quota}],
            }
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    create_kueue_object(
        custom,
        "clusterqueues",
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": f"{namespace}-cq"},
            "spec": spec,
        },
    )
    create_kueue_object(
        custom,
        "localqueues",
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": namespace},
            "spec": {"clusterQueue": f"{namespace}-cq"},
        },
        namespace,
    )


def _multikueue(custom: Any, core: Any, namespace: str, worker: Worker) -> str:
    """Secret (the worker's kubeconfig, certificates inlined as Kueue requires),
    MultiKueueCluster, MultiKueueConfig and the AdmissionCheck on the manager; its name."""
    name = f"{namespace}-mk"
    kubeconfig = worker.cluster.kubectl("config", "view", "--raw", "--flatten", "--minify").stdout
    core.create_namespaced_secret(
        "kueue-system",
        {"metadata": {"name": name}, "stringData": {"kubeconfig": kubeconfig}},
    )
    api = "/".join(KUEUE)
    create_kueue_object(
        custom,
        "multikueueclusters",
        {
            "apiVersion": api,
            "kind": "MultiKueueCluster",
            "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": name}}},
        },
    )
    create_kueue_object(
        custom,
        "multikueueconfigs",
        {
            "apiVersion": api,
            "kind": "MultiKueueConfig",
            "metadata": {"name": name},
            "spec": {"clusters": [name]},
        },
    )
    create_kueue_object(
        custom,
        "admissionchecks",
        {
            "apiVersion": api,
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {
                "controllerName": MULTIKUEUE,
                "parameters": {"apiGroup": KUEUE[0], "kind": "MultiKueueConfig", "name": name},
            },
        },
    )

    def active() -> bool:
        ac = custom.get_cluster_custom_object(*KUEUE, "admissionchecks", name)
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (ac.get("status") or {}).get("conditions") or []
        )

    k.wait_for(
        active,
        60,
        lambda: (
            f"AdmissionCheck {name} Active (the worker reachable)\n"
            f"{custom.get_cluster_custom_object(*KUEUE, 'multikueueclusters', name)}"
        ),
        interval=0.5,
    )
    return name


@pytest.fixture(scope="module")
def manager_kueue(
    cluster: k.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueProcess]:
    with running_kueue(cluster, tmp_path_factory.mktemp("kueue"), MANAGER_KUEUE) as proc:
        yield proc


def _workload(custom: Any, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            *KUEUE, namespace, "workloads", f"torchjob-{name}"
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _running(jobs: Jobs, name: str, count: int) -> list[Any] | None:
    pods = jobs.pods(name)
    return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None


def _condition(obj: dict[str, Any] | None, type_: str) -> str | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return str(c["status"])
    return None


def test_multikueue_runs_a_torchjob_on_the_worker_and_its_status_shows_on_the_manager(
    jobs: Jobs, manager_kueue: KueueProcess, worker: Worker, kube: Any
) -> None:
    ns = jobs.ns
    custom, core = jobs.custom, jobs.core
    w_custom, w_core = client.CustomObjectsApi(worker.api), client.CoreV1Api(worker.api)
    w_core.create_namespace({"metadata": {"name": ns}})
    w_jobs = Jobs(worker.cluster, worker.api, ns, worker.operator)
    _flavor_and_queue(w_custom, ns, [])
    check = _multikueue(custom, core, ns, worker)
    _flavor_and_queue(custom, ns, [check])
    try:
        body = torchjob("far", replicas=2, managedBy=MULTIKUEUE)
        body["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
        jobs.apply(body)

        # On the worker: the copy, without managedBy, run by the operator there.
        # Its generation is 0 if the operator's first look finds MultiKueue's Workload
        # admitted already, else 1 (held until its cache has it): either is right.
        pods = k.wait_for(
            lambda: _running(w_jobs, "far", 2),
            120,
            lambda: f"2 Running pods on the worker\n{w_jobs.describe('far')}",
        )
        copy = w_jobs.get("far")
        assert copy is not None and "managedBy" not in copy["spec"]
        assert copy["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] == "torchjob-far"
        # On the manager: its Workload admitted through the check, no pod; the status is the worker's.
        # MultiKueue names the cluster on the manager's Workload once the worker's copy is
        # admitted, and writes that apart from (and possibly after) the copy's pods running.
        k.wait_for(
            lambda: (
                ((_workload(custom, ns, "far") or {}).get("status") or {}).get("clusterName")
                == check
            ),
            60,
            lambda: f"the manager's Workload names {check}\n{_workload(custom, ns, 'far')}",
        )
        assert jobs.pods("far") == []
        jobs.wait_phase("far", "Running", timeout=60)

        for p in pods:
            w_jobs.exit_pod(p.metadata.name, 0)
        w_jobs.wait_phase("far", "Succeeded")
        jobs.wait_phase("far", "Succeeded", timeout=60)
        k.wait_for(
            lambda: _condition(_workload(custom, ns, "far"), "Finished") == "True",
            60,
            lambda: f"the manager's Workload Finished\n{_workload(custom, ns, 'far')}",
        )
        assert jobs.pods("far") == []
        # The operator on the manager wrote no status: every Event of its own is the Workload's.
        assert set(jobs.event_reasons("far")) <= {"CreatedWorkload"}, jobs.describe("far")
    finally:
        try:
            remove_queue(
                custom,
                ns,
                f"{ns}-cq",
                f"{ns}-flavor",
                more=[
                    ("admissionchecks", check),
                    ("multikueueconfigs", check),
                    ("multikueueclusters", check),
                ],
            )
        finally:
            core.delete_namespaced_secret(check, "kueue-system")


def test_a_job_another_controller_manages_is_left_alone(jobs: Jobs) -> None:
    other = torchjob("theirs", replicas=1, managedBy="example.com/other")
    other["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    jobs.apply(other)
    jobs.apply(torchjob("ours", replicas=1))
    # The operator has seen the namespace's jobs once ours runs; theirs stays untouched.
    jobs.wait_running_pods("ours", 1, generation=0)
    assert jobs.pods("theirs") == []
    assert jobs.status("theirs") == {}
    assert jobs.events("theirs") == []
    assert _workload(jobs.custom, jobs.ns, "theirs") is None
    wide = jobs.kubectl("get", "torchjob", "theirs", "-o", "wide").stdout
    assert "example.com/other" in wide, wide
    # Immutable, as batch/v1 Job's.
    patch = jobs.kubectl(
        "patch", "torchjob", "theirs", "--type=merge",
        "-p", yaml.safe_dump({"spec": {"managedBy": "torchjob.io/operator"}}),
        check=False,
    )  # fmt: skip
    assert patch.returncode != 0 and "spec.managedBy is immutable" in patch.stderr, patch.stderr
