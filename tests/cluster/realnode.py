"""A real node (kubelet + containerd, hack/node.sh) in the test cluster, the images it runs
(hack/images.sh), and the operator installed on it with the Helm chart.

``RealNode.start`` builds (or reuses) the images, starts the node, imports the images into its
containerd and records how long each step took. ``HelmOperator`` installs
charts/torchjob-operator with the operator image, waits for its pod, and gives the operator's
``kubectl logs`` for failure messages.

``start_node_s3`` runs the object store of tests/s3.py (SeaweedFS' ``weed``) for the node's
pods: on the host, listening only on ``RealNode.host_ip``, the host end of the node's veth,
where pods already reach the API server (their traffic is masqueraded to the node's address
on the way out of the node's namespace). ``s3_credentials`` puts its identity in a Secret
for a container's ``envFrom``.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tests import kube as k
from tests.s3 import S3Server, start_s3_server

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
CHART = REPO / "charts" / "torchjob-operator"
NODE_LABEL = "torchjob.io/real-node"
TOLERATION = {"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
IMAGES = ("operator", "runtime-cpu", "pause")


class RealNodeUnavailable(RuntimeError):
    """A prerequisite of the real node is missing (say which, and how to install it)."""


def _run(args: list[str], timeout: float, what: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}{proc.stdout[-2000:]}"
        )
    return proc.stdout


@dataclass
class RealNode:
    name: str
    timings: dict[str, float] = field(default_factory=dict)
    host_ip: str = ""
    """The host's address as the node's pods reach it (``hack/node.sh host-ip``); empty on a
    node this harness did not start (hack/e2e-kind.sh's)."""

    @staticmethod
    def prerequisites_problem() -> str | None:
        """None when hack/node.sh and hack/images.sh can run here, else what is missing."""
        proc = subprocess.run(
            ["bash", str(HACK / "node.sh"), "prereqs"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            return proc.stderr.strip() or "hack/node.sh prereqs failed"
        if not any(_which(e) for e in ("podman", "docker")):
            return "missing: podman or docker (Debian: apt-get install podman)"
        if not _which("mmdebstrap"):
            return "missing: mmdebstrap, which builds the local Debian bases of the images"
        return None

    @classmethod
    def start(cls) -> RealNode:
        timings: dict[str, float] = {}
        t = time.monotonic()
        _run(["bash", str(HACK / "images.sh"), "build", *IMAGES], 1800, "hack/images.sh build")
        timings["images build"] = time.monotonic() - t
        t = time.monotonic()
        _run(["bash", str(HACK / "node.sh"), "up"], 300, "hack/node.sh up")
        timings["node up"] = time.monotonic() - t
        t = time.monotonic()
        tars = [
            _run(["bash", str(HACK / "images.sh"), "save", i], 600, f"hack/images.sh save {i}")
            .strip()
            .splitlines()[-1]
            for i in IMAGES
        ]
        timings["images save"] = time.monotonic() - t
        t = time.monotonic()
        _run(["bash", str(HACK / "node.sh"), "import", *tars], 600, "hack/node.sh import")
        timings["images import"] = time.monotonic() - t
        name = _run(["bash", str(HACK / "node.sh"), "name"], 30, "hack/node.sh name").strip()
        host_ip = _run(["bash", str(HACK / "node.sh"), "host-ip"], 30, "hack/node.sh host-ip")
        return cls(name=name, timings=timings, host_ip=host_ip.strip())

    def log_tails(self, kubeconfig: Path) -> str:
        state = kubeconfig.parent / "realnode"
        parts = []
        for f in ("kubelet", "containerd", "coredns", "inside"):
            try:
                lines = (state / f"{f}.log").read_text(errors="replace").splitlines()[-20:]
            except OSError:
                lines = ["(none)"]
            parts.append(f"--- {f}.log (tail)\n" + "\n".join(lines))
        return "\n".join(parts)


def _which(name: str) -> bool:
    return any(
        os.access(os.path.join(d, name), os.X_OK)
        for d in os.environ.get("PATH", "").split(os.pathsep)
    )


def start_node_s3(node: RealNode, root: Path) -> S3Server:
    """SeaweedFS' ``weed server -s3`` on the host, every port on ``node.host_ip`` only: the
    node's pods and the tests (on the host) use the same endpoint. Why not a pod: the store
    outlives any pod a test deletes or evicts, needs no image, and starts before the node
    schedules anything; it is gone with the session (``stop_s3_server``)."""
    if not node.host_ip:
        raise RealNodeUnavailable(
            f"node {node.name} has no host address for an object store (not hack/node.sh's)"
        )
    return start_s3_server(root, ip=node.host_ip)


def s3_credentials(
    core: Any, namespace: str, server: S3Server, name: str = "s3-credentials", **env: str
) -> dict[str, Any]:
    """A Secret in ``namespace`` holding ``server.env()`` (``AWS_*``: the identity, the
    endpoint, the region) with ``env`` overriding keys (bad credentials); returns the
    container's ``envFrom`` entry for it."""
    data = {**server.env(), **env}
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": name}, "type": "Opaque", "stringData": data}
    )
    return {"secretRef": {"name": name}}


def image(name: str) -> str:
    return _run(["bash", str(HACK / "images.sh"), "ref", name], 30, "hack/images.sh ref").strip()


class HelmOperator:
    """The chart installed with the locally built operator image, on the real node."""

    def __init__(self, cluster: k.Cluster, core: Any, namespace: str, release: str) -> None:
        self.cluster = cluster
        self.core = core
        self.ns = namespace
        self.release = release
        self.values: dict[str, Any] = {}

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(k.helm_path()), "--kubeconfig", str(self.cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}{proc.stdout}\n"
                f"{self.logs()}"
            )
        return proc

    def install(self, values_file: Path, *extra: str, command: str = "install") -> None:
        ref = image("operator")
        repository, tag = ref.rsplit(":", 1)
        self.values = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [TOLERATION],
            "resyncPeriodSeconds": 10,
        }
        values_file.write_text(yaml.safe_dump(self.values))
        self.helm(
            command,
            self.release,
            str(CHART),
            "--namespace",
            self.ns,
            "--values",
            str(values_file),
            "--wait",
            "--timeout=4m",
            *extra,
        )
        self.wait_ready()

    def pods(self) -> list[Any]:
        return [
            p
            for p in self.core.list_namespaced_pod(
                self.ns, label_selector="app.kubernetes.io/name=torchjob-operator"
            ).items
            if p.metadata.deletion_timestamp is None
        ]

    def wait_ready(self, timeout: float = 180) -> Any:
        def ready() -> Any:
            pods = self.pods()
            if len(pods) != 1:
                return None
            pod = pods[0]
            cond = k.pod_condition(pod, "Ready")
            return pod if cond is not None and cond.status == "True" else None

        return k.wait_for(
            ready, timeout, lambda: f"the operator pod Ready\n{self.logs()}", interval=0.5
        )

    def logs(self, tail: int = 40) -> str:
        parts = [k.describe_namespace(self.core, self.ns)]
        for pod in self.pods():
            out = self.cluster.kubectl(
                "-n", self.ns, "logs", pod.metadata.name, f"--tail={tail}", check=False
            )
            parts.append(f"--- kubectl logs {pod.metadata.name}:\n{out.stdout}{out.stderr}")
        return "\n".join(parts)
