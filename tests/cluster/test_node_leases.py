"""A node whose kubelet stopped renewing its Lease gets no new pod, while the API server
still shows it Ready (``engine.nodewatch.LeaseWatch``, ``common.nodes.quiet``), against the
real control plane.

The quiet node is the test's own Node, without kwok: the test writes its status (Ready, its
heartbeat every 2 s, which keeps the node controller from marking it) and its Lease in
``kube-node-lease``, renewed every 2 s until the test stops; so the node is Ready for as long
as the test needs, and only its Lease says that its kubelet is gone."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob, worker_template

from torchjob import contract
from torchjob_operator.common.nodes import AVOIDED_NODES, LEASE_QUIET_S

pytestmark = pytest.mark.cluster

NODE_LEASES = "kube-node-lease"
TAINT_KEY = "torchjob.io/test-leases"
BEAT_S = 2.0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Kubelet:
    """What a kubelet writes for its node: the Ready condition's heartbeat and the Lease.
    ``renewing`` off: the heartbeat goes on (the node stays Ready) and the Lease stops."""

    def __init__(self, core: Any, coordination: Any, node: str) -> None:
        self.core, self.coordination, self.node = core, coordination, node
        self.renewing = threading.Event()
        self.renewing.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet:{node}", daemon=True)
        self.renewals = 0

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def beat(self) -> None:
        now = _now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": now,
        }
        self.core.patch_node_status(self.node, {"status": {"conditions": [ready]}})
        if not self.renewing.is_set():
            return
        body = {"spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": now}}
        try:
            self.coordination.patch_namespaced_lease(self.node, NODE_LEASES, body)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            self.coordination.create_namespaced_lease(
                NODE_LEASES, {"metadata": {"name": self.node}, **body}
            )
        self.renewals += 1

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            with contextlib.suppress(Exception):  # the next beat tries again
                self.beat()


@contextlib.contextmanager
def own_node(core: Any, name: str, label: dict[str, str]) -> Iterator[Kubelet]:
    """A Node no kwok plays (nothing runs its pods), Ready while the returned ``Kubelet``
    beats; deleted after, with its Lease."""
    manifest = k.fake_node_manifest(name, gpus=0, labels=label, taints=[_taint()])
    del manifest["metadata"]["annotations"][k.KWOK_NODE_ANNOTATION]
    status = manifest.pop("status")
    core.create_node(manifest)
    coordination = client.CoordinationV1Api(core.api_client)
    kubelet = Kubelet(core, coordination, name)
    try:
        core.patch_node_status(name, {"status": status})
        kubelet.start()
        k.wait_for(
            lambda: (
                k.node_ready_status(core, name) == "True"
                and not any(t.key.startswith("node.kubernetes.io/") for t in _taints(core, name))
            ),
            60,
            f"node {name} Ready, without the node controller's taints",
        )
        yield kubelet
    finally:
        kubelet.stop()
        k.delete_node(core, name)
        with contextlib.suppress(client.ApiException):
            coordination.delete_namespaced_lease(name, NODE_LEASES)


def _taint() -> dict[str, str]:
    return {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def _taints(core: Any, node: str) -> list[Any]:
    return list(core.read_node(node).spec.taints or [])


def test_a_node_whose_lease_is_not_renewed_gets_no_new_pod_until_it_renews(jobs: Jobs) -> None:
    """Issue 39 (bench/results/2026-12-05v repeat 2): a node back within the node
    controller's grace, whose kubelet has not renewed its Lease, looks Ready and empty and
    took a whole restart's pods, lost moments later. Here the only other node has room for
    one pod: the second is kept off the quiet node, still Ready, and waits; once its Lease
    is renewed the operator makes that pod again (PlacingAgain) and it goes there."""
    tag = uuid.uuid4().hex[:6]
    label = {"torchjob.io/test-leases": tag}
    live = k.add_fake_node(
        jobs.core, f"lease-live-{tag}", gpus=0, pods=1, labels=label, taints=[_taint()]
    )
    try:
        with own_node(jobs.core, f"lease-quiet-{tag}", label) as kubelet:
            quiet = kubelet.node
            # Renewed a few times: a Lease is judged once it was seen renewed.
            k.wait_for(lambda: kubelet.renewals >= 3, 30, "three renewals")
            kubelet.renewing.clear()
            stopped = datetime.now(timezone.utc)
            template = worker_template(
                nodeSelector=label,
                tolerations=[{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            )
            name = f"leases-{tag}"
            # Applied once the Lease is older than LEASE_QUIET_S (the node still Ready).
            k.wait_for(
                lambda: (
                    (datetime.now(timezone.utc) - stopped).total_seconds()
                    > LEASE_QUIET_S + 2 * BEAT_S
                ),
                LEASE_QUIET_S + 30,
                "the Lease quiet",
                interval=0.5,
            )
            assert k.node_ready_status(jobs.core, quiet) == "True"
            jobs.apply(torchjob(name, replicas=2, template=template))

            def placed() -> dict[str, Any] | None:
                pods = {p.metadata.name: p for p in jobs.pods(name)}
                return pods if len(pods) == 2 else None

            pods = k.wait_for(placed, 30, lambda: f"two pods\n{jobs.describe(name)}")
            for pod in pods.values():
                assert quiet in pod.metadata.annotations[AVOIDED_NODES].split(","), pod.metadata
            assert k.node_ready_status(jobs.core, quiet) == "True", "kept off by its Lease"
            told = jobs.wait_events(name, "KeptOffNodes")
            kept = next(e for e in told if e.reason == "KeptOffNodes")
            assert f"{quiet} (its kubelet's Lease not renewed)" in kept.message, kept.message

            def waiting() -> Any | None:
                stuck = [p for p in jobs.pods(name) if p.spec.node_name is None]
                bound = [p.spec.node_name for p in jobs.pods(name) if p.spec.node_name]
                assert quiet not in bound, f"a pod went to the quiet node\n{jobs.describe(name)}"
                return stuck[0] if len(stuck) == 1 and bound == [live] else None

            held = k.wait_for(waiting, 60, lambda: f"one pod on {live}\n{jobs.describe(name)}")
            kubelet.renewing.set()

            def moved() -> Any | None:
                pods = [p for p in jobs.pods(name) if p.spec.node_name == quiet]
                return pods[0] if pods else None

            again = k.wait_for(moved, 60, lambda: f"a pod on {quiet}\n{jobs.describe(name)}")
            assert again.metadata.uid != held.metadata.uid, "made again: affinity is immutable"
            assert again.metadata.labels[contract.LABEL_GENERATION] == "0"
            said = jobs.wait_events(name, "PlacingAgain")
            placed_again = next(e for e in said if e.reason == "PlacingAgain")
            assert f"kept off {quiet}" in placed_again.message, placed_again.message
            status = jobs.status(name)
            assert (status.get("disruptions", 0), status.get("restarts", 0)) == (0, 0), status
    finally:
        k.delete_node(jobs.core, live)
