"""Kueue admission against the real Kueue controller (issue 17; tests/cluster/kueue_harness.py).

Each test has its own ClusterQueue whose quota (1 CPU) admits one of two TorchJobs
(2 workers x 300m). Never skipped: if Kueue is not built or cannot start, the tests fail
saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.kueue_harness import (
    KUEUE,
    KueueProcess,
    create_kueue_object,
    remove_queue,
    running_kueue,
)
from tests.cluster.operator_harness import Jobs, torchjob, worker_template

pytestmark = pytest.mark.cluster

TOLERATION = {"key": "torchjob.io/kueue-test", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def kueue(cluster: k.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KueueProcess]:
    with running_kueue(cluster, tmp_path_factory.mktemp("kueue")) as proc:
        yield proc


@pytest.fixture
def queue(kueue: KueueProcess, kube: Any, namespace: str) -> Iterator[str]:
    """LocalQueue ``lq`` of a ClusterQueue (1 CPU, preemption of lower priorities) on a
    flavor that puts a node label and a toleration on the pods it admits."""
    custom = client.CustomObjectsApi(kube)
    flavor, cq = f"{namespace}-flavor", f"{namespace}-cq"
    create_kueue_object(
        custom,
        "resourceflavors",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"type": "kwok"}, "tolerations": [TOLERATION]},
        },
    )
    create_kueue_object(
        custom,
        "clusterqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1"},
                                    {"name": "memory", "nominalQuota": "4Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    create_kueue_object(
        custom,
        "localqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
        namespace,
    )
    yield "lq"
    remove_queue(custom, namespace, cq, flavor)


def queued_job(name: str, queue: str, priority: str | None = None) -> dict[str, Any]:
    body = torchjob(name, replicas=2, template=worker_template())
    body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "300m"
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    return body


def workload(jobs: Jobs, name: str) -> dict[str, Any] | None:
    try:
        return jobs.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            *KUEUE, jobs.ns, "workloads", f"torchjob-{name}"
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c  # type: ignore[no-any-return]
    return None


def ready_reason(jobs: Jobs, name: str) -> str | None:
    c = condition(jobs.get(name), "Ready")
    return c["reason"] if c else None


def finish(jobs: Jobs, name: str, generation: int) -> None:
    for pod in jobs.wait_running_pods(name, 2, generation=generation):
        jobs.exit_pod(pod.metadata.name, 0)
    jobs.wait_phase(name, "Succeeded")


def test_quota_admits_one_job_the_second_waits_without_pods_and_starts_when_quota_frees(
    jobs: Jobs, queue: str
) -> None:
    jobs.apply(queued_job("first", queue))
    pods = jobs.wait_running_pods("first", 2, generation=1)
    wl = workload(jobs, "first")
    assert wl is not None
    owner = wl["metadata"]["ownerReferences"][0]
    first = jobs.get("first")
    assert first is not None
    assert owner["kind"] == "TorchJob" and owner["controller"] is True
    assert owner["uid"] == first["metadata"]["uid"]
    assert wl["spec"]["podSets"][0]["count"] == 2
    for p in pods:  # the admission's flavor: its node label and toleration
        assert p.spec.node_selector["type"] == "kwok"
        assert any(t.key == TOLERATION["key"] for t in p.spec.tolerations or [])

    jobs.apply(queued_job("second", queue))
    k.wait_for(
        lambda: ready_reason(jobs, "second") == "WaitingForAdmission",
        30,
        lambda: jobs.describe("second"),
    )
    assert jobs.status("second")["phase"] == "Suspended"
    assert jobs.pods("second") == []
    # Kueue writes QuotaReserved=False when it has tried and found no room; the
    # Workload may exist a moment before Kueue's controller first looks at it.
    k.wait_for(
        lambda: (
            (condition(workload(jobs, "second"), "QuotaReserved") or {}).get("status") == "False"
        ),
        30,
        lambda: f"Workload torchjob-second QuotaReserved=False\n{workload(jobs, 'second')}",
    )
    assert jobs.pods("second") == []

    finish(jobs, "first", 1)
    k.wait_for(
        lambda: (condition(workload(jobs, "first"), "Finished") or {}).get("status") == "True",
        30,
        lambda: f"Workload torchjob-first Finished\n{workload(jobs, 'first')}",
    )
    jobs.wait_running_pods("second", 2, generation=1)
    jobs.wait_events("first", "CreatedWorkload", "FinishedWorkload")


def test_a_higher_priority_job_preempts_one_that_resumes_later_without_a_charged_restart(
    jobs: Jobs, queue: str, kube: Any
) -> None:
    custom = client.CustomObjectsApi(kube)
    for name, value in ((f"{jobs.ns}-low", 10), (f"{jobs.ns}-high", 1000)):
        create_kueue_object(
            custom,
            "workloadpriorityclasses",
            {
                "apiVersion": "/".join(KUEUE),
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    try:
        jobs.apply(queued_job("low", queue, priority=f"{jobs.ns}-low"))
        jobs.wait_running_pods("low", 2, generation=1)
        jobs.apply(queued_job("high", queue, priority=f"{jobs.ns}-high"))

        k.wait_for(
            lambda: ready_reason(jobs, "low") == "AdmissionEvicted",
            60,
            lambda: jobs.describe("low"),
        )
        jobs.wait_running_pods("high", 2, generation=1)
        low = jobs.status("low")
        assert low["phase"] == "Suspended"
        assert low.get("restarts", 0) == 0 and low["disruptions"] == 1
        assert jobs.pods("low") == []
        jobs.wait_events("low", "AdmissionEvicted", "ReleasedQuota")

        finish(jobs, "high", 1)
        jobs.wait_running_pods("low", 2, generation=2)  # a new generation: from the checkpoint
        assert jobs.status("low").get("restarts", 0) == 0
    finally:
        for name in (f"{jobs.ns}-low", f"{jobs.ns}-high"):
            try:
                custom.delete_cluster_custom_object(*KUEUE, "workloadpriorityclasses", name)
            except client.ApiException as e:
                if e.status != 404:
                    raise


def test_the_operator_outlives_kueue_being_uninstalled(kueue: KueueProcess, jobs: Jobs) -> None:
    """Last in the module: Kueue's CRDs go while the operator watches its Workloads. The
    operator goes on, saying it looks for them again (kopf's watch of a removed CRD ended
    the whole operator with the 404), and still runs jobs."""
    op = jobs.operator
    kueue.stop()

    def said() -> bool:
        assert op.proc is not None and op.proc.poll() is None, f"the operator ended:\n{op.logs()}"
        return "Kueue Workloads are not served" in op.log_path.read_text(errors="replace")

    k.wait_for(said, 120, lambda: f"the operator's word on Kueue's absence\n{op.logs()}")
    jobs.apply(torchjob("after-kueue", replicas=1))
    jobs.wait_running_pods("after-kueue", 1, generation=0)
    assert op.proc is not None and op.proc.poll() is None, op.logs()
