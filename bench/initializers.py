"""An initialiser fetching once vs every worker fetching its own copy, on the real node.

The real node (kubelet + containerd, hack/node.sh), the operator installed by the Helm chart,
the object store of tests/s3.py where the node's pods reach it (tests/cluster/realnode.py
``start_node_s3``), and one object of ``--size-mib`` (default 1024: 1 GiB). Two TorchJobs of
``--workers`` pods (default 2) in the CPU runtime image, one after the other:

- ``initializer``: ``spec.initializers.dataset`` fetches the object ONCE, on a CPU pod, into a
  claim on a host directory; the workers then read it from the volume;
- ``each worker``: no initialiser; every worker runs the same fetch (``torchjob initialize``)
  into its own emptyDir, then reads it.

Per row it prints: the wall time from ``kubectl apply`` until every worker has the data and
until every worker has read it, the slowest worker's own fetch, and the bytes taken from the
object store. Clocks: the pods' and the bench's are the same machine's.

    python bench/initializers.py [--size-mib 1024] [--workers 2] [--keep-cluster]

It asserts nothing and never runs in ``make test``. The figures depend on the machine: on a
shared, loaded machine compare the rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import kube as k  # noqa: E402
from tests.cluster.realnode import (  # noqa: E402
    NODE_LABEL,
    TOLERATION,
    HelmOperator,
    RealNode,
    image,
    s3_credentials,
    start_node_s3,
)
from tests.cluster.volumes import bound_claim  # noqa: E402
from tests.s3 import stop_s3_server  # noqa: E402

OPERATOR_NS = "torchjob-system"
NAMESPACE = "bench-initializers"
WORKER = """
import json, os, subprocess, time
start = time.time()
path = os.environ.get("TORCHJOB_DATASET_PATH")
if not path:  # no initialiser: this worker fetches its own copy, with the same code
    path = "/scratch/dataset"
    subprocess.run(["torchjob", "initialize", "--uri", os.environ["URI"], "--target", path],
                   check=True, stdout=subprocess.DEVNULL)
have = time.time()
n = 0
with open(os.path.join(path, "big.bin"), "rb") as f:
    while chunk := f.read(16 << 20):
        n += len(chunk)
print("BENCH " + json.dumps({"start": start, "have": have, "read": time.time(), "bytes": n}))
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def manifest(name: str, uri: str, secret: str, workers: int, init: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "worker",
        "image": image("runtime-cpu"),
        "imagePullPolicy": "Never",
        "command": ["python3", "-c", WORKER],
        "env": [{"name": "URI", "value": uri}],
        "envFrom": [{"secretRef": {"name": secret}}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }
    spec: dict[str, Any] = {
        "replicas": workers,
        "failurePolicy": {"maxRestarts": 0},
        "template": {
            "spec": {
                "nodeSelector": {NODE_LABEL: "true"},
                "tolerations": [TOLERATION],
                "terminationGracePeriodSeconds": 5,
                "containers": [container],
            }
        },
    }
    if init:
        spec["initializers"] = {
            "volume": {"claimName": "bench-data"},
            "dataset": {"uri": uri, "secretName": secret},
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [TOLERATION],
        }
    else:
        container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        spec["template"]["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def run_row(cluster: k.Cluster, core: Any, body: dict[str, Any], workers: int) -> dict[str, Any]:
    name = body["metadata"]["name"]
    applied = time.time()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))

    def finished() -> str | None:
        out = cluster.kubectl(
            "-n", NAMESPACE, "get", f"tj/{name}", "-o", "jsonpath={.status.phase}", check=False
        ).stdout.strip()
        return out if out in ("Succeeded", "Failed") else None

    phase = k.wait_for(finished, 1800, f"TorchJob {name} to finish", interval=1.0)
    seen = []
    for i in range(workers):
        out = cluster.kubectl("-n", NAMESPACE, "logs", f"{name}-worker-{i}", check=False).stdout
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCH ")), None)
        if line is None:
            raise RuntimeError(f"{name}-worker-{i} printed no BENCH line ({phase}):\n{out}")
        seen.append(json.loads(line[6:]))
    status = json.loads(cluster.kubectl("-n", NAMESPACE, "get", f"tj/{name}", "-o", "json").stdout)[
        "status"
    ]
    init_s = None
    for init in status.get("initializers") or ():
        pod = core.read_namespaced_pod(init["pod"], NAMESPACE)
        term = pod.status.container_statuses[0].state.terminated
        init_s = (term.finished_at - term.started_at).total_seconds()
    cluster.kubectl("-n", NAMESPACE, "delete", f"tj/{name}", "--wait=true")
    return {
        "phase": phase,
        "have": max(s["have"] for s in seen) - applied,
        "read": max(s["read"] for s in seen) - applied,
        "fetch": max(s["have"] - s["start"] for s in seen),
        "init": init_s,
        "bytes": sum(s["bytes"] for s in seen),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--keep-cluster", action="store_true")
    args = p.parse_args(argv)
    from kubernetes import client

    problem = RealNode.prerequisites_problem()
    if problem:
        print(f"the real node cannot run here: {problem}", file=sys.stderr)
        return 2
    kubeconfig = k.cluster_up()
    cluster = k.Cluster(kubeconfig=kubeconfig)
    node = RealNode.start()
    log(f"real node {node.name}: " + ", ".join(f"{n} {s:.0f}s" for n, s in node.timings.items()))
    core = client.CoreV1Api(cluster.api_client())
    op = HelmOperator(cluster, core, OPERATOR_NS, "torchjob")
    op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
    work = Path(tempfile.mkdtemp(prefix="tj-bench-init-"))
    op.install(work / "values.yaml", "--create-namespace")
    server = start_node_s3(node, work / "s3")
    pv = None
    try:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", check=False)
        cluster.kubectl("create", "namespace", NAMESPACE)
        bucket = server.make_bucket()
        big = work / "big.bin"
        with big.open("wb") as f:
            for _ in range(args.size_mib // 64 or 1):
                f.write(os.urandom(64 << 20 if args.size_mib >= 64 else args.size_mib << 20))
        size = big.stat().st_size
        log(f"uploading {size >> 20} MiB to s3://{bucket}/big.bin")
        server.fs().put_file(str(big), f"{bucket}/big.bin")
        big.unlink()
        secret = s3_credentials(core, NAMESPACE, server)["secretRef"]["name"]
        volume = work / "volume"
        volume.mkdir()
        volume.chmod(0o777)
        pv = bound_claim(core, NAMESPACE, "bench-data", volume)
        uri = f"s3://{bucket}/big.bin"
        rows = {}
        for label, init in (("initializer", True), ("each worker", False)):
            log(f"row: {label}")
            body = manifest(f"bench-{'init' if init else 'each'}", uri, secret, args.workers, init)
            rows[label] = run_row(cluster, core, body, args.workers)
        print(f"\n{size >> 20} MiB object, {args.workers} workers, one real node (s)")
        print(f"{'':34}{'initializer':>14}{'each worker':>14}")
        a, b = rows["initializer"], rows["each worker"]
        fetched = (size, size * args.workers)
        table = [
            ("apply -> every worker has the data", a["have"], b["have"]),
            ("apply -> every worker has read it", a["read"], b["read"]),
            ("the initializer pod's fetch", a["init"], None),
            ("slowest worker's own fetch", a["fetch"], b["fetch"]),
        ]
        for what, x, y in table:
            cells = "".join(f"{v:>14.1f}" if v is not None else f"{'-':>14}" for v in (x, y))
            print(f"{what:34}{cells}")
        print(f"{'MiB taken from the object store':34}{fetched[0] >> 20:>14}{fetched[1] >> 20:>14}")
        print(f"{'job phase':34}{a['phase']:>14}{b['phase']:>14}")
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", check=False)
        if pv is not None:
            core.delete_persistent_volume(pv)
        stop_s3_server(server)
        op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
        if not args.keep_cluster:
            subprocess.run(["bash", str(REPO / "hack" / "cluster.sh"), "down"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
