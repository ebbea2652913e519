"""Smoke tests proving the local control plane is the real one.

Each test asserts behaviour that only the real kube-scheduler, kube-controller-manager or
kube-apiserver produce (kwok only plays kubelets), plus the kwok Stages torchjob adds.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests import kube as k

pytestmark = pytest.mark.cluster


def _running(pod: Any) -> bool:
    return pod.status.phase == "Running" and bool(pod.spec.node_name)


def _gpus_per_node(core: Any, node: str) -> int:
    return int(core.read_node(node).status.allocatable[k.GPU_RESOURCE])


def test_gpu_pod_lands_only_on_a_gpu_node(cluster: k.Cluster, core_v1: Any, namespace: str) -> None:
    gpu_nodes = set(cluster.gpu_nodes(core_v1))
    assert gpu_nodes, "the cluster has no GPU nodes"
    assert cluster.cpu_nodes(core_v1), "the cluster has no CPU-only nodes"
    names = [f"gpu-{i}" for i in range(6)]
    for name in names:
        core_v1.create_namespaced_pod(namespace, k.pod_manifest(name, gpus=1))
    for name in names:
        pod = k.wait_for_pod(core_v1, namespace, name, _running, 60, "Running")
        assert pod.spec.node_name in gpu_nodes, (
            f"{name} landed on non-GPU node {pod.spec.node_name}"
        )
        # kwok's pod-ready stage filled in what a kubelet reports.
        assert pod.status.pod_ip
        assert pod.status.container_statuses[0].ready is True
        assert pod.status.container_statuses[0].state.running is not None


def test_pod_asking_more_gpus_than_any_node_stays_unschedulable(
    cluster: k.Cluster, core_v1: Any, namespace: str
) -> None:
    most = max(_gpus_per_node(core_v1, n) for n in cluster.gpu_nodes(core_v1))
    core_v1.create_namespaced_pod(namespace, k.pod_manifest("greedy", gpus=most + 1))

    def unschedulable(pod: Any) -> bool:
        c = k.pod_condition(pod, "PodScheduled")
        return c is not None and c.status == "False" and c.reason == "Unschedulable"

    pod = k.wait_for_pod(
        core_v1, namespace, "greedy", unschedulable, 60, "PodScheduled=False/Unschedulable"
    )
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None
    assert "nvidia.com/gpu" in (k.pod_condition(pod, "PodScheduled").message or "")


@pytest.fixture
def priority_classes(kube: Any) -> Any:
    sched = client.SchedulingV1Api(kube)
    suffix = uuid.uuid4().hex[:6]
    low, high = f"tj-test-low-{suffix}", f"tj-test-high-{suffix}"
    k.create_priority_class(kube, low, 1000)  # each returns once admission resolves it
    k.create_priority_class(kube, high, 100000)
    try:
        yield low, high
    finally:
        for name in (low, high):
            sched.delete_priority_class(name)


@pytest.fixture
def private_node(core_v1: Any, namespace: str) -> Any:
    """A GPU node only this test schedules onto (tainted, selected by a unique label), so
    that filling or breaking it cannot disturb tests running beside it (other sessions share
    the cluster). Yields (name, nodeSelector, tolerations)."""
    name = f"private-{namespace}"[:63].rstrip("-")
    key = "torchjob.io/private-node"
    k.add_fake_node(
        core_v1,
        name,
        gpus=8,
        labels={key: namespace},
        taints=[{"key": key, "value": namespace, "effect": "NoSchedule"}],
    )
    tolerate = [{"key": key, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}]
    try:
        yield name, {key: namespace}, tolerate
    finally:
        k.delete_node(core_v1, name)


PrivateNode = tuple[str, dict[str, str], list[dict[str, str]]]


def test_scheduler_preempts_lower_priority_pod(
    core_v1: Any, namespace: str, priority_classes: tuple[str, str], private_node: PrivateNode
) -> None:
    low, high = priority_classes
    node, pin, tolerate = private_node
    gpus = _gpus_per_node(core_v1, node)
    # The victim keeps a grace period so its DisruptionTarget condition can be observed
    # while it terminates (kwok removes it at its deletionTimestamp).
    core_v1.create_namespaced_pod(
        namespace,
        k.pod_manifest(
            "victim",
            gpus=gpus,
            priority_class=low,
            node_selector=pin,
            tolerations=tolerate,
            grace_seconds=5,
        ),
    )
    victim = k.wait_for_pod(core_v1, namespace, "victim", _running, 60, "Running")
    assert victim.spec.node_name == node
    assert victim.spec.priority == 1000  # resolved by the Priority admission plugin

    core_v1.create_namespaced_pod(
        namespace,
        k.pod_manifest(
            "preemptor", gpus=gpus, priority_class=high, node_selector=pin, tolerations=tolerate
        ),
    )

    # The scheduler patches the DisruptionTarget condition first and deletes the victim in a
    # second request, so wait for both rather than asserting on the first observation.
    def disrupted_and_deleted(pod: Any) -> bool:
        c = k.pod_condition(pod, "DisruptionTarget")
        return c is not None and c.status == "True" and pod.metadata.deletion_timestamp is not None

    victim = k.wait_for_pod(
        core_v1,
        namespace,
        "victim",
        disrupted_and_deleted,
        60,
        "DisruptionTarget condition and a deletionTimestamp",
    )
    cond = k.pod_condition(victim, "DisruptionTarget")
    assert cond.reason == "PreemptionByScheduler"

    k.wait_for_pod_gone(core_v1, namespace, "victim", 60)
    preemptor = k.wait_for_pod(core_v1, namespace, "preemptor", _running, 60, "Running")
    assert preemptor.spec.node_name == node

    # The scheduler's event recorder posts asynchronously (a broadcaster, batched): wait for it.
    def preempted_event() -> bool:
        events = core_v1.list_namespaced_event(
            namespace, field_selector="involvedObject.name=victim"
        ).items
        return any(e.reason == "Preempted" for e in events)

    k.wait_for(
        preempted_event, 30, "a Preempted Event on the victim", core=core_v1, namespace=namespace
    )


def test_eviction_api_respects_pdb_then_evicts(kube: Any, core_v1: Any, namespace: str) -> None:
    labels = {"app": "evictee"}
    core_v1.create_namespaced_pod(
        namespace, k.pod_manifest("evictee", labels=labels, grace_seconds=5)
    )
    k.wait_for_pod(core_v1, namespace, "evictee", _running, 60, "Running")
    policy = client.PolicyV1Api(kube)
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="keep-one"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1, selector=client.V1LabelSelector(match_labels=labels)
            ),
        ),
    )

    def pdb_computed() -> bool:
        st = policy.read_namespaced_pod_disruption_budget("keep-one", namespace).status
        return st is not None and st.current_healthy == 1 and st.disruptions_allowed == 0

    k.wait_for(
        pdb_computed,
        60,
        "the disruption controller to compute the PDB",
        core=core_v1,
        namespace=namespace,
    )
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="evictee", namespace=namespace))
    with pytest.raises(ApiException) as blocked:
        core_v1.create_namespaced_pod_eviction("evictee", namespace, eviction)
    assert blocked.value.status == 429, blocked.value

    policy.delete_namespaced_pod_disruption_budget("keep-one", namespace)
    core_v1.create_namespaced_pod_eviction("evictee", namespace, eviction)
    pod = core_v1.read_namespaced_pod("evictee", namespace)
    assert pod.metadata.deletion_timestamp is not None
    cond = k.pod_condition(pod, "DisruptionTarget")
    assert cond is not None and cond.reason == "EvictionByEvictionAPI"
    k.wait_for_pod_gone(core_v1, namespace, "evictee", 60)


def test_kubectl_server_side_apply(cluster: k.Cluster, namespace: str) -> None:
    manifest = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ssa", "namespace": namespace},
            "data": {"owner": "tests"},
        }
    )
    out = cluster.kubectl(
        "apply", "--server-side", "--field-manager=torchjob-tests", "-f", "-", input=manifest
    )
    assert "serverside-applied" in out.stdout
    cm = json.loads(
        cluster.kubectl(
            "get", "configmap", "ssa", "-n", namespace, "-o", "json", "--show-managed-fields"
        ).stdout
    )
    managers = {(m["manager"], m["operation"]) for m in cm["metadata"]["managedFields"]}
    assert ("torchjob-tests", "Apply") in managers
    # A different manager changing an owned field gets a conflict: field ownership is real.
    changed = manifest.replace('"tests"', '"someone-else"')
    conflict = cluster.kubectl(
        "apply", "--server-side", "--field-manager=intruder", "-f", "-", input=changed, check=False
    )
    assert conflict.returncode != 0
    assert "conflict" in conflict.stderr.lower()


@pytest.mark.parametrize(
    ("code", "phase", "reason"), [(3, "Failed", "Error"), (0, "Succeeded", "Completed")]
)
def test_kwok_stage_makes_pod_exit_with_code(
    core_v1: Any, namespace: str, code: int, phase: str, reason: str
) -> None:
    core_v1.create_namespaced_pod(namespace, k.pod_manifest("worker"))
    k.wait_for_pod(core_v1, namespace, "worker", _running, 60, "Running")
    k.make_pod_exit(core_v1, namespace, "worker", code)
    pod = k.wait_for_pod_phase(core_v1, namespace, "worker", phase, 60)
    term = pod.status.container_statuses[0].state.terminated
    assert term is not None
    assert term.exit_code == code
    assert term.reason == reason
    assert k.pod_condition(pod, "Ready").status == "False"


def test_node_not_ready_taints_and_evicts_through_controller_manager(
    core_v1: Any, namespace: str, private_node: PrivateNode
) -> None:
    node, pin, tolerate = private_node
    tolerate_briefly = [
        *tolerate,
        {
            "key": k.NOT_READY_TAINT,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 1,
        },
    ]
    core_v1.create_namespaced_pod(
        namespace,
        k.pod_manifest(
            "on-sick-node", node_selector=pin, tolerations=tolerate_briefly, grace_seconds=5
        ),
    )
    k.wait_for_pod(core_v1, namespace, "on-sick-node", _running, 60, "Running")
    k.make_node_not_ready(core_v1, node)
    try:
        k.wait_for(lambda: k.node_ready_status(core_v1, node) == "False", 30, f"{node} Ready=False")

        def tainted() -> bool:
            taints = core_v1.read_node(node).spec.taints or []
            return any(t.key == k.NOT_READY_TAINT and t.effect == "NoExecute" for t in taints)

        k.wait_for(tainted, 60, f"kube-controller-manager to taint {node} not-ready:NoExecute")

        def evicted(pod: Any) -> bool:
            c = k.pod_condition(pod, "DisruptionTarget")
            return c is not None and c.status == "True"

        pod = k.wait_for_pod(
            core_v1, namespace, "on-sick-node", evicted, 60, "DisruptionTarget condition"
        )
        assert k.pod_condition(pod, "DisruptionTarget").reason == "DeletionByTaintManager"
        k.wait_for_pod_gone(core_v1, namespace, "on-sick-node", 60)
    finally:
        k.restore_node_ready(core_v1, node)

    def healthy_again() -> bool:
        taints = core_v1.read_node(node).spec.taints or []
        return k.node_ready_status(core_v1, node) == "True" and not any(
            t.key == k.NOT_READY_TAINT for t in taints
        )

    k.wait_for(healthy_again, 60, f"{node} Ready again and untainted by the controller-manager")
