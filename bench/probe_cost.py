"""What a readiness probe costs the node: exec against tcpSocket against none.

An elastic job's replacement pods (joiners) carried an exec readiness probe every second for
their whole life; the kubelet runs each as a ``runc exec`` of a new process in the container.
This measures the machine's busy CPU (``/proc/stat``) while ``--pods`` idle pods of the
runtime image run on the real node, with no probe, an exec probe, a tcpSocket probe (what
joiners carry since 15121d9b) and an exec probe again, each at 1 s, and prints each against
the no-probe baseline. Needs the local cluster with a real node and nothing else running:

    make cluster-nodes REAL_NODES=1
    .venv/bin/python bench/probe_cost.py [--pods 8] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import kube as k
from tests.cluster.realnode import NODE_LABEL, TOLERATION, image

PORT = 29499
LISTEN = f"import socket\ns = socket.create_server(('', {PORT}))\nwhile True: s.accept()[0].close()"
PROBES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "exec": {"exec": {"command": ["test", "-e", "/tmp"]}},
    "tcpSocket": {"tcpSocket": {"port": PORT}},
}


def busy_cpus() -> float:
    """CPU-seconds the machine has been busy (not idle, not waiting on I/O)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def pod(i: int, probe: dict[str, Any] | None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "c",
        "image": image("runtime-cpu"),
        "command": ["python3", "-c", LISTEN],
    }
    if probe is not None:
        c["readinessProbe"] = {**probe, "periodSeconds": 1, "failureThreshold": 1}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"probe-cost-{i}", "labels": {"bench": "probe-cost"}},
        "spec": {
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 0,
            "containers": [c],
        },
    }


def measure(cluster: k.Cluster, probe: dict[str, Any] | None, pods: int, seconds: float) -> float:
    """The machine's busy CPUs over ``seconds`` with ``pods`` pods carrying ``probe``."""
    items = {"apiVersion": "v1", "kind": "List", "items": [pod(i, probe) for i in range(pods)]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(items))
    try:
        cluster.kubectl(
            "wait", "--for=condition=Ready", "pod", "-l", "bench=probe-cost", "--timeout=180s",
            timeout=200,
        )  # fmt: skip
        time.sleep(10)  # the starts settle
        b0, t0 = busy_cpus(), time.monotonic()
        time.sleep(seconds)
        return (busy_cpus() - b0) / (time.monotonic() - t0)
    finally:
        cluster.kubectl("delete", "pod", "-l", "bench=probe-cost", "--wait=true", timeout=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pods", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    cluster = k.Cluster(kubeconfig=k.default_kubeconfig())
    got: dict[str, list[float]] = {}
    for name in ("none", "exec", "tcpSocket", "exec"):
        cpus = measure(cluster, PROBES[name], args.pods, args.seconds)
        got.setdefault(name, []).append(cpus)
        print(f"{name:<9} {cpus:.3f} CPUs busy over {args.seconds:.0f}s", flush=True)
    base = got["none"][0]
    for name in ("exec", "tcpSocket"):
        extra = [c - base for c in got[name]]
        each = [1000 * e / args.pods for e in extra]  # ms of CPU per probe (one a second each)
        print(
            f"{name}: +{min(extra):.3f} to +{max(extra):.3f} CPUs over no probe for {args.pods} "
            f"pods, {min(each):.0f}-{max(each):.0f} ms of CPU per probe"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
