"""The operator's writes against the real API server: what their preconditions protect."""

from __future__ import annotations

from typing import Any

from tests import kube as k

from torchjob_operator.engine.client import KubeClient


def test_a_delete_with_a_stale_uid_leaves_the_newer_same_named_pod(
    kube: Any, core_v1: Any, namespace: str
) -> None:
    """A plan made from a cache that still held the last generation's worker-0 must not
    delete this generation's worker-0, created since under the same name."""
    ops = KubeClient(kube)
    # Never scheduled: no kubelet, kwok stage, node lifecycle or pod garbage collection acts
    # on these pods, only the API server and the writes under test. (Scheduled onto a kwok
    # node, the new pod was once gone or changed between the read above and the delete
    # below, in a cold CI run; what removed it left no trace in the test's output.)
    pod = k.pod_manifest("worker-0", node_selector={"torchjob.test/no-such-node": "true"})
    old = core_v1.create_namespaced_pod(namespace, pod)
    core_v1.delete_namespaced_pod("worker-0", namespace, grace_period_seconds=0)
    k.wait_for_pod_gone(core_v1, namespace, "worker-0", 60)
    new = core_v1.create_namespaced_pod(namespace, pod)
    assert new.metadata.uid != old.metadata.uid

    assert ops.delete_pod(namespace, "worker-0", old.metadata.uid) is False
    still = core_v1.read_namespaced_pod("worker-0", namespace)
    assert still.metadata.uid == new.metadata.uid and still.metadata.deletion_timestamp is None

    assert ops.delete_pod(namespace, "worker-0", new.metadata.uid) is True, k.describe_namespace(
        core_v1, namespace
    )
    k.wait_for_pod_gone(core_v1, namespace, "worker-0", 60)
    assert ops.delete_pod(namespace, "worker-0", new.metadata.uid) is False, "gone: 404"
