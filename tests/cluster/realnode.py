"""Real nodes (kubelet + containerd, hack/node.sh) in the test cluster, the images they run
(hack/images.sh), and the operator installed on them with the Helm chart.

``RealNode.start`` builds (or reuses) the images, starts the nodes (``TORCHJOB_REAL_NODES``,
default 1; ``count`` to ask for more), imports the images into each node's containerd and
records how long each step took. ``RealNode.name`` is node 0, ``RealNode.names`` every node.

Node faults (hack/node.sh, docs/development.md "Node faults"): ``vanish`` freezes every process
of a node and cuts its link, ``return_node`` brings it back, ``notice`` does what a termination
handler does (the provider's taint, a drain through the Eviction API, then vanish) in the
background; ``frozen`` and ``node_processes`` show the node's processes from the host.

``HelmOperator`` installs
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

import pytest
import yaml
from tests import kube as k
from tests.s3 import S3Server, start_s3_server

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
CHART = REPO / "charts" / "torchjob-operator"
NODE_LABEL = "torchjob.io/real-node"
INDEX_LABEL = "torchjob.io/real-node-index"
"""Node K of hack/node.sh carries ``torchjob.io/real-node-index=K``."""
TOLERATION = {"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
IMAGES = ("operator", "runtime-cpu", "pause")
NOTICE_TAINTS = {
    "aws": "aws-node-termination-handler/spot-itn",
    "karpenter": "karpenter.sh/disrupted",
    "karpenter-v0": "karpenter.sh/disruption",
    "gke": "cloud.google.com/impending-node-termination",
}
"""The taint key (effect NoSchedule) each termination handler puts on a node it was told will
go: AWS Node Termination Handler (spot interruption), Karpenter (v1, and before v1 with the
value ``disrupting``), GKE."""


def real_node_count() -> int:
    """How many real nodes a session starts: ``TORCHJOB_REAL_NODES`` (default 1)."""
    raw = os.environ.get("TORCHJOB_REAL_NODES", "1")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"TORCHJOB_REAL_NODES={raw!r}: a number of real nodes") from None


class RealNodeUnavailable(RuntimeError):
    """A prerequisite of the real node is missing (say which, and how to install it)."""


def _run(args: list[str], timeout: float, what: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}{proc.stdout[-2000:]}"
        )
    return proc.stdout


def _node_sh(*args: str, timeout: float, count: int | None = None) -> str:
    env = dict(os.environ)
    if count is not None:
        env["TORCHJOB_REAL_NODES"] = str(count)
    proc = subprocess.run(
        ["bash", str(HACK / "node.sh"), *args],
        capture_output=True,
        text=True,
        timeout=k.scaled(timeout),
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"hack/node.sh {' '.join(args)} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-6000:]}{proc.stdout[-2000:]}"
        )
    return proc.stdout


@dataclass
class RealNode:
    name: str
    timings: dict[str, float] = field(default_factory=dict)
    host_ip: str = ""
    """The host's address as the node's pods reach it (``hack/node.sh host-ip``); empty on a
    node this harness did not start (hack/e2e-kind.sh's)."""
    names: list[str] = field(default_factory=list)
    """Every real node of the cluster, node 0 (``name``) first."""

    def __post_init__(self) -> None:
        if not self.names:
            self.names = [self.name]

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
    def start(cls, count: int | None = None) -> RealNode:
        """Start (or reuse) ``count`` real nodes (default ``real_node_count()``); nodes that
        already run are kept, and an image already in a node is not imported again."""
        count = count or real_node_count()
        timings: dict[str, float] = {}
        t = time.monotonic()
        _run(["bash", str(HACK / "images.sh"), "build", *IMAGES], 1800, "hack/images.sh build")
        timings["images build"] = time.monotonic() - t
        t = time.monotonic()
        tars = [
            _run(["bash", str(HACK / "images.sh"), "save", i], 600, f"hack/images.sh save {i}")
            .strip()
            .splitlines()[-1]
            for i in IMAGES
        ]
        timings["images save"] = time.monotonic() - t
        t = time.monotonic()
        # A node started here begins with the images imported and unpacked (a seeded root,
        # prepared once per set of images: hack/node-roots.sh); the import then has nothing
        # left to do but for a node that ran already with other images.
        _node_sh("up", *tars, timeout=900, count=count)
        timings["node up"] = time.monotonic() - t
        t = time.monotonic()
        _node_sh("import", *tars, timeout=900)
        timings["images import"] = time.monotonic() - t
        names = _node_sh("names", timeout=30, count=count).split()
        host_ip = _node_sh("host-ip", timeout=30).strip()
        return cls(name=names[0], timings=timings, host_ip=host_ip, names=names)

    def setup_line(self) -> str:
        """What starting the nodes took, for the session's output."""
        took = ", ".join(f"{what} {s:.0f}s" for what, s in self.timings.items())
        return f"real nodes {', '.join(self.names or [self.name])}: {took or 'reused'}"

    def log_tails(self, kubeconfig: Path, node: str | None = None) -> str:
        """The end of the logs of ``node`` (default node 0)."""
        index = self.names.index(node or self.name)
        state = kubeconfig.parent / "realnode" / f"real-{index}"
        parts = []
        for f in ("kubelet", "containerd", "coredns", "inside"):
            try:
                lines = (state / f"{f}.log").read_text(errors="replace").splitlines()[-20:]
            except OSError:
                lines = ["(none)"]
            parts.append(f"--- {node or self.name} {f}.log (tail)\n" + "\n".join(lines))
        return "\n".join(parts)

    # --- node faults (hack/node.sh vanish / return / notice) -----------------------------

    def vanish(self, node: str) -> None:
        """Cut ``node``'s link (every packet dropped, silently) and freeze all its processes."""
        _node_sh("vanish", node, timeout=120)

    def reclaim(self, node: str) -> None:
        """A vanished ``node``'s VM is gone: SIGKILL its pods' processes (its daemons stay
        frozen, its link cut), so that they stop holding this machine's memory."""
        _node_sh("reclaim", node, timeout=60)

    def return_node(self, node: str, wait: bool = True) -> None:
        """Thaw ``node`` and restore its link, undo a notice's taint, condition and cordon;
        with ``wait``, until the Node is Ready again."""
        _node_sh("return", node, *([] if wait else ["--no-wait"]), timeout=300)

    def partition(self, a: str, b: str) -> None:
        """Cut the link between nodes ``a`` and ``b`` (and their pods) only: each still reaches
        the API server, the host and the other nodes."""
        _node_sh("partition", a, b, timeout=60)

    def heal(self, a: str, b: str) -> None:
        """Restore the link that :meth:`partition` cut."""
        _node_sh("heal", a, b, timeout=60)

    def notice(
        self,
        node: str,
        provider: str = "aws",
        drain_after: int = 0,
        vanish_after: int | None = None,
        condition: str | None = None,
    ) -> subprocess.Popen[str]:
        """What a termination handler does, in the background: ``provider``'s taint (and a
        Node condition ``condition``) now, a drain through the Eviction API after
        ``drain_after`` seconds, the node vanishes ``vanish_after`` seconds after the notice
        (hack/node.sh's default: 120, gke 30). ``wait()`` on the process; its stderr says what
        it did."""
        if provider not in NOTICE_TAINTS:
            raise ValueError(f"provider {provider!r}: one of {', '.join(NOTICE_TAINTS)}")
        args = ["notice", node, "--provider", provider, "--drain-after", str(drain_after)]
        if vanish_after is not None:
            args += ["--vanish-after", str(vanish_after)]
        if condition:
            args += ["--condition", condition]
        return subprocess.Popen(
            ["bash", str(HACK / "node.sh"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def state(self, node: str, kubeconfig: Path) -> Path:
        """``node``'s state directory (hack/node.sh): its containerd root, kubelet's files,
        the daemons' logs, the image archives it was given (``imported``)."""
        return kubeconfig.parent / "realnode" / f"real-{self.names.index(node)}"

    def containerd(self, node: str, kubeconfig: Path, *args: str) -> str:
        """``ctr -n k8s.io ARGS`` against ``node``'s containerd (in its mount namespace)."""
        pid = (self.state(node, kubeconfig) / "node.pid").read_text().strip()
        sock = "/run/containerd/containerd.sock"
        cmd = ["nsenter", "--target", pid, "--mount", "ctr", "--address", sock, "-n", "k8s.io"]
        return _run([*cmd, *args], 60, f"ctr {' '.join(args)} on {node}")

    def freezer(self, node: str, kubeconfig: Path) -> Path:
        """The cgroup that holds every process of ``node`` (v1: in the freezer hierarchy)."""
        cluster = kubeconfig.parent.name
        index = self.names.index(node)
        base = Path("/sys/fs/cgroup")
        v1 = not (base / "cgroup.controllers").exists()
        return (base / "freezer" if v1 else base) / f"torchjob-{cluster}" / f"real-{index}"

    def frozen(self, node: str, kubeconfig: Path) -> bool:
        """Whether the kernel reports every process of ``node`` frozen."""
        cg = self.freezer(node, kubeconfig)
        if (cg / "freezer.state").exists():
            return (cg / "freezer.state").read_text().strip() == "FROZEN"
        return "frozen 1" in (cg / "cgroup.events").read_text().splitlines()

    def node_processes(self, node: str, kubeconfig: Path) -> set[int]:
        """Every process of ``node``: its daemons, shims and pods' containers."""
        cg = self.freezer(node, kubeconfig)
        return {int(pid) for procs in cg.rglob("cgroup.procs") for pid in procs.read_text().split()}


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


def tell(config: pytest.Config, line: str) -> None:
    """``line`` on the session's terminal now, whatever pytest captures: what a session-wide
    setup took (the e2e suite decides ``make test``'s wall, and its setup is a good part)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(line)
        return
    with capture.global_and_fixture_disabled():  # else fd 1 is captured during a setup
        reporter.write_line(line)


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
            # Past helm's own --timeout (240 s times CI's scale), so that helm says what it
            # waited on; a fixed 300 s cut an upgrade short at 1 CPU.
            timeout=k.scaled(300) + 60,
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
            f"--timeout={k.scaled(240):.0f}s",
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
