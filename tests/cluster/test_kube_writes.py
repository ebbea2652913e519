"""The operator's writes against the real API server: what their preconditions protect."""

from __future__ import annotations

from typing import Any

from tests import kube as k

from torchjob_operator.kube import KubeClient


def test_a_delete_with_a_stale_uid_leaves_the_newer_same_named_pod(
    kube: Any, core_v1: Any, namespace: str
) -> None:
    """A plan made from a cache that still held the last generation's worker-0 must not
    delete this generation's worker-0, created since under the same name."""
    ops = KubeClient(kube)
    old = core_v1.create_namespaced_pod(namespace, k.pod_manifest("worker-0"))
    core_v1.delete_namespaced_pod("worker-0", namespace, grace_period_seconds=0)
    k.wait_for_pod_gone(core_v1, namespace, "worker-0", 60)
    new = core_v1.create_namespaced_pod(namespace, k.pod_manifest("worker-0"))
    assert new.metadata.uid != old.metadata.uid

    assert ops.delete_pod(namespace, "worker-0", old.metadata.uid) is False
    still = core_v1.read_namespaced_pod("worker-0", namespace)
    assert still.metadata.uid == new.metadata.uid and still.metadata.deletion_timestamp is None

    assert ops.delete_pod(namespace, "worker-0", new.metadata.uid) is True
    k.wait_for_pod_gone(core_v1, namespace, "worker-0", 60)
    assert ops.delete_pod(namespace, "worker-0", new.metadata.uid) is False, "gone: 404"
