"""Three real nodes (hack/node.sh, TORCHJOB_REAL_NODES=3) and the node faults of hack/node.sh.

One pod per node (the CPU runtime image, a TCP server on port 7000 that answers with its name
and the address it saw) behind a headless Service. The pods reach each other across nodes by
pod IP (routes between the nodes, no NAT) and by the Service's DNS names (each node's CoreDNS);
``vanish`` freezes a node and cuts its link (no answer, no reset; the Node goes Unknown after
node-monitor-grace-period, checked in test_node_faults.py's vanish); ``return`` brings the same
processes back; ``reclaim`` kills a vanished node's pods without a word to anyone (its memory
freed, as a gone VM's is); ``notice`` taints, drains through the Eviction API, then vanishes
the node.
The operator is not involved: these tests prove the cluster and the tools.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests import kube as k
from tests.cluster.pod_procs import pod_processes
from tests.cluster.realnode import INDEX_LABEL, NOTICE_TAINTS, TOLERATION, RealNode, image

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.realnode]

PORT = 7000
SERVICE = "peers"
HOLD = k.HOLD  # a finalizer that keeps an evicted pod readable

SERVER = f"""
import os, signal, socket
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
server = socket.create_server(("", {PORT}))
while True:
    conn, addr = server.accept()
    conn.sendall(f"{{os.environ['POD_NAME']}} saw {{addr[0]}}\\n".encode())
    conn.close()
"""

# Run in a pod: resolve each name given (retrying while DNS and the servers come up), connect,
# read the answer; and every address of the Service's own name.
PROBE = f"""
import json, socket, sys, time

def ask(name):
    deadline = time.monotonic() + 60
    while True:
        try:
            ip = socket.getaddrinfo(name, {PORT}, proto=socket.IPPROTO_TCP)[0][4][0]
            with socket.create_connection((ip, {PORT}), timeout=5) as conn:
                return {{"ip": ip, "reply": conn.recv(200).decode().strip()}}
        except OSError as exc:
            if time.monotonic() > deadline:
                return {{"error": repr(exc)}}
            time.sleep(0.5)

out = {{name: ask(name) for name in sys.argv[1:]}}
# The headless Service lists a pod once its EndpointSlice says Ready, and CoreDNS caches an
# answer up to 30 s: ask until all three are there (or a minute passed).
deadline = time.monotonic() + 60
while True:
    infos = socket.getaddrinfo("{SERVICE}", {PORT}, proto=socket.IPPROTO_TCP)
    out["{SERVICE}"] = sorted({{info[4][0] for info in infos}})
    if len(out["{SERVICE}"]) >= 3 or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps(out))
"""

# Run in a pod: one connection to argv[1] with a timeout of argv[2] seconds; what happened.
CONNECT = f"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], {PORT}), timeout=float(sys.argv[2])) as conn:
        print("answered:", conn.recv(200).decode().strip())
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(f"error {{exc.errno}}: {{exc}}")
"""


@dataclass
class Peers:
    ns: str
    pods: list[str]
    """peer-K runs on real node K."""

    def pod(self, core: Any, i: int) -> Any:
        return core.read_namespaced_pod(self.pods[i], self.ns)


def peer_pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"peer-{i}", "labels": {"app": SERVICE}, "finalizers": [HOLD]},
        "spec": {
            "hostname": f"peer-{i}",
            "subdomain": SERVICE,
            "nodeSelector": {INDEX_LABEL: str(i)},
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "server",
                    "image": image("runtime-cpu"),
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", SERVER],
                    "env": [
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        }
                    ],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                }
            ],
        },
    }


def is_ready(pod: Any) -> bool:
    cond = k.pod_condition(pod, "Ready")
    return cond is not None and cond.status == "True"


def release(core: Any, ns: str, pod: str) -> None:
    """Remove the test's finalizer (the pod may then go)."""
    k.release_held(core, ns, pod)


@pytest.fixture(scope="module")
def peers(real_nodes: RealNode, cluster: k.Cluster, core_v1: Any) -> Iterator[Peers]:
    ns = f"t-real-nodes-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace({"metadata": {"name": ns, "labels": {"torchjob.io/test": "true"}}})
    k.wait_for(
        lambda: (
            core_v1.list_namespaced_service_account(
                ns, field_selector="metadata.name=default"
            ).items
        ),
        30,
        f"ServiceAccount {ns}/default",
    )
    core_v1.create_namespaced_service(
        ns,
        {
            "metadata": {"name": SERVICE},
            "spec": {"clusterIP": "None", "selector": {"app": SERVICE}, "ports": [{"port": PORT}]},
        },
    )
    pods = [f"peer-{i}" for i in range(3)]
    for i in range(3):
        core_v1.create_namespaced_pod(ns, peer_pod(i))
    for pod in pods:
        k.wait_for_pod(
            core_v1,
            ns,
            pod,
            is_ready,
            timeout=300,
            what="Ready",
        )
    try:
        yield Peers(ns=ns, pods=pods)
    finally:
        for pod in pods:
            release(core_v1, ns, pod)
        core_v1.delete_namespace(ns, propagation_policy="Background")


def exec_python(cluster: k.Cluster, ns: str, pod: str, code: str, *args: str) -> str:
    out = cluster.kubectl("-n", ns, "exec", pod, "--", "python3", "-c", code, *args, timeout=120)
    return out.stdout.strip()


def test_pods_on_three_nodes_reach_each_other_by_pod_ip_and_the_headless_services_dns(
    real_nodes: RealNode, peers: Peers, cluster: k.Cluster, core_v1: Any
) -> None:
    pods = [peers.pod(core_v1, i) for i in range(3)]
    assert [p.spec.node_name for p in pods] == real_nodes.names[:3]
    ips = [p.status.pod_ip for p in pods]
    # Each node its own pod range (a /27 of the cluster's 10.214.IDX.0/24).
    assert len({ipaddress.ip_network(f"{ip}/27", strict=False) for ip in ips}) == 3, ips
    for i in range(3):
        others = [j for j in range(3) if j != i]
        names = [f"peer-{j}.{SERVICE}" for j in others]
        seen = json.loads(exec_python(cluster, peers.ns, peers.pods[i], PROBE, *names))
        for j, name in zip(others, names, strict=True):
            # The pod's DNS name resolves to the other pod's IP; the connection arrives from
            # this pod's own IP (routed between the nodes, no NAT).
            assert seen[name] == {"ip": ips[j], "reply": f"peer-{j} saw {ips[i]}"}, seen
        assert seen[SERVICE] == sorted(ips), seen


def test_the_nodes_began_with_the_images_unpacked_from_one_seeded_root(
    real_nodes: RealNode, peers: Peers, cluster: k.Cluster
) -> None:
    """``hack/node.sh up TAR...`` (hack/node-roots.sh): every node's containerd began from one
    root prepared with the images imported and unpacked, hard-linked, so the image layers are
    one file on disk for all three nodes; each node's containerd has every image complete and
    unpacked for its snapshotter, and the peers' containers run from them."""
    kubeconfig = Path(cluster.kubeconfig)
    blobs = "containerd/root/io.containerd.content.v1.content/blobs/sha256"
    layers: list[dict[str, int]] = []
    for node in real_nodes.names[:3]:
        state = real_nodes.state(node, kubeconfig)
        imported = (state / "imported").read_text().split()
        assert {Path(t).name.split("-")[0] for t in imported} >= {"operator", "runtime"}, imported
        layers.append(
            {
                f.name: f.stat().st_ino
                for f in (state / blobs).iterdir()
                if f.stat().st_size > 1 << 20
            }
        )
        checked = real_nodes.containerd(node, kubeconfig, "images", "check").splitlines()[1:]
        assert checked and all(line.split()[-1] == "true" for line in checked), checked
    assert layers[0] and layers[0] == layers[1] == layers[2], "the same inodes on every node"
    assert all(
        f.stat().st_nlink >= 4
        for f in (real_nodes.state(real_nodes.names[0], kubeconfig) / blobs).iterdir()
        if f.name in layers[0]
    ), "the seeded root and three nodes"


def test_vanish_freezes_every_process_of_the_node_and_cuts_its_link_and_return_revives_it(
    real_nodes: RealNode, peers: Peers, cluster: k.Cluster, core_v1: Any
) -> None:
    node, kubeconfig = real_nodes.names[2], Path(cluster.kubeconfig)
    victim = peers.pod(core_v1, 2)
    watcher = peers.pods[1]
    pod_pids = {pid for pid, _ in pod_processes(victim.metadata.uid)}
    assert pod_pids, "the victim pod's processes, seen from the host"
    real_nodes.vanish(node)
    try:
        assert real_nodes.frozen(node, kubeconfig)
        frozen = real_nodes.node_processes(node, kubeconfig)
        assert pod_pids <= frozen, (pod_pids, frozen)
        commands = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid in frozen}
        for daemon in (b"kubelet", b"containerd", b"coredns", b"containerd-shim-runc-v2"):
            assert any(c.endswith(daemon) for c in commands), (daemon, commands)
        # Nothing answers and nothing resets: a connection from another node times out.
        said = exec_python(cluster, peers.ns, watcher, CONNECT, victim.status.pod_ip, "3")
        assert said == "timeout", said
        # The node controller then hears nothing either, and marks the node Ready=Unknown
        # after node-monitor-grace-period (40 s): checked where a job's node vanishes
        # (test_node_faults.py), so that the suite waits those 40 s once.
    finally:
        real_nodes.return_node(node)
    assert not real_nodes.frozen(node, kubeconfig)
    assert k.node_ready_status(core_v1, node) == "True"
    # The same process answers again, its container never restarted.
    said = k.wait_for(
        lambda: (
            (
                s := exec_python(cluster, peers.ns, watcher, CONNECT, victim.status.pod_ip, "5")
            ).startswith("answered")
            and s
        ),
        60,
        "the victim pod to answer again",
        interval=1.0,
    )
    ip = peers.pod(core_v1, 1).status.pod_ip
    assert said == f"answered: peer-2 saw {ip}", said
    assert {pid for pid, _ in pod_processes(victim.metadata.uid)} == pod_pids
    after = peers.pod(core_v1, 2)
    assert after.status.container_statuses[0].restart_count == 0


# Before the notice test, which drains peer-1 for good (the pods are the module's).
def test_partition_cuts_two_nodes_from_each_other_only_and_heal_restores_them(
    real_nodes: RealNode, peers: Peers, cluster: k.Cluster, core_v1: Any
) -> None:
    a, b = real_nodes.names[0], real_nodes.names[1]
    ips = [peers.pod(core_v1, i).status.pod_ip for i in range(3)]

    def connect(src: int, dst: int) -> str:
        return exec_python(cluster, peers.ns, peers.pods[src], CONNECT, ips[dst], "3")

    real_nodes.partition(a, b)
    try:
        # Silent both ways between A and B (no reset, no ICMP: a timeout)...
        assert connect(0, 1) == "timeout"
        assert connect(1, 0) == "timeout"
        # ...while each still reaches C, and C both of them.
        assert connect(0, 2) == f"answered: peer-2 saw {ips[0]}"
        assert connect(1, 2) == f"answered: peer-2 saw {ips[1]}"
        assert connect(2, 0) == f"answered: peer-0 saw {ips[2]}"
        # The nodes still report to the API server: both stay Ready.
        assert k.node_ready_status(core_v1, a) == k.node_ready_status(core_v1, b) == "True"
    finally:
        real_nodes.heal(a, b)
    assert connect(0, 1) == f"answered: peer-1 saw {ips[0]}"
    assert connect(1, 0) == f"answered: peer-0 saw {ips[1]}"


def test_notice_taints_then_drains_through_the_eviction_api_then_the_node_vanishes(
    real_nodes: RealNode, peers: Peers, cluster: k.Cluster, core_v1: Any
) -> None:
    node, kubeconfig = real_nodes.names[1], Path(cluster.kubeconfig)
    pod = peers.pods[1]
    drain_after = 3
    start = time.time()
    proc = real_nodes.notice(node, provider="karpenter", drain_after=drain_after, vanish_after=15)
    try:
        taint = k.wait_for(
            lambda: next(
                (
                    t
                    for t in core_v1.read_node(node).spec.taints or []
                    if t.key in NOTICE_TAINTS.values()
                ),
                None,
            ),
            30,
            f"the notice's taint on {node}",
            interval=0.2,
        )
        assert (taint.key, taint.effect) == ("karpenter.sh/disrupted", "NoSchedule")
        evicted = k.wait_for(
            lambda: (p := peers.pod(core_v1, 1)).metadata.deletion_timestamp and p,
            60,
            f"{pod} evicted",
            interval=0.5,
        )
        # The drain came drain_after seconds after the notice (timestamps are whole seconds),
        # through the Eviction API, and cordoned the node.
        assert evicted.metadata.deletion_timestamp.timestamp() >= int(start) + drain_after - 1
        disruption = k.pod_condition(evicted, "DisruptionTarget")
        assert disruption is not None and disruption.reason == "EvictionByEvictionAPI", evicted
        assert core_v1.read_node(node).spec.unschedulable
        release(core_v1, peers.ns, pod)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        assert real_nodes.frozen(node, kubeconfig), out
    finally:
        if proc.poll() is None:
            proc.kill()
        real_nodes.return_node(node)
    # return undoes what the notice set.
    after = core_v1.read_node(node)
    assert not after.spec.unschedulable
    assert not [t for t in after.spec.taints or [] if t.key in NOTICE_TAINTS.values()]


HOLD_PORT = 7001
HOLDER = f"""
import socket
server = socket.create_server(("", {HOLD_PORT}))
conn, _ = server.accept()
conn.recv(1)
"""
# From another pod: connect to the holder (retrying while it starts), say so, then wait for a
# word from it: "closed" (a FIN), "error N" (a reset), or "timeout" (nothing at all).
LISTEN = f"""
import socket, sys, time
deadline = time.monotonic() + 60
while True:
    try:
        conn = socket.create_connection((sys.argv[1], {HOLD_PORT}), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
print("connected", flush=True)
conn.settimeout(float(sys.argv[2]))
try:
    print("closed" if not conn.recv(1) else "data")
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(f"error {{exc.errno}}")
"""


def test_reclaim_kills_a_vanished_nodes_pods_and_no_one_hears_of_it(
    real_nodes: RealNode, peers: Peers, cluster: k.Cluster, core_v1: Any
) -> None:
    """A vanished node's VM is gone, and its memory with it: ``reclaim`` kills its pods'
    processes (the fleet bench's lost nodes give this machine's memory back), its daemons stay
    frozen, and a peer whose connection the killed process held hears nothing: no FIN, no
    reset (the link was cut first). Last in the module: peer-2's container dies here."""
    node, kubeconfig = real_nodes.names[2], Path(cluster.kubeconfig)
    victim = peers.pod(core_v1, 2)
    kubectl = [str(k.kubectl_path()), "--kubeconfig", str(kubeconfig), "-n", peers.ns, "exec"]
    holder = subprocess.Popen(
        [*kubectl, peers.pods[2], "--", "python3", "-c", HOLDER], stdin=subprocess.DEVNULL
    )
    listen = subprocess.Popen(
        [*kubectl, peers.pods[0], "--", "python3", "-c", LISTEN, victim.status.pod_ip, "20"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listen.stdout is not None and listen.stdout.readline().strip() == "connected"
        pod_pids = {pid for pid, _ in pod_processes(victim.metadata.uid)}
        assert pod_pids, "the victim pod's processes, seen from the host"
        real_nodes.vanish(node)
        real_nodes.reclaim(node)
        # No process of the pod holds memory any more: each is gone, or on its way out with
        # its memory freed (a zombie its frozen shim has not reaped; the container's init
        # waiting for an exec'd process, whose parent is that shim, to be reaped); the daemons
        # are still there, frozen.
        holding = {pid: status for pid in pod_pids if "VmRSS" in (status := process_status(pid))}
        assert not holding, holding
        assert real_nodes.frozen(node, kubeconfig)
        left = real_nodes.node_processes(node, kubeconfig)
        commands = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid in left}
        for daemon in (b"kubelet", b"containerd"):
            assert any(c.endswith(daemon) for c in commands), (daemon, commands)
        out, _ = listen.communicate(timeout=60)
        assert out.strip() == "timeout", out
    finally:
        for proc in (holder, listen):
            if proc.poll() is None:
                proc.kill()
        real_nodes.return_node(node)
    assert not real_nodes.frozen(node, kubeconfig)
    assert k.node_ready_status(core_v1, node) == "True"


def process_status(pid: int) -> str:
    """/proc/PID/status ("" when the process is gone): a process that holds memory has a
    ``VmRSS`` line, one whose memory was freed on its way out has none."""
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
