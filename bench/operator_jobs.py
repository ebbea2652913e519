"""The jobs of the operator benchmark (bench/operator_vs_kubeflow.py): a TorchJob of 8 pods
against a PyTorchJob of 1 Master + 7 Workers on kwok nodes, what differs between the two
operators (``Flavor``), and the API server's count of job-related requests."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import kubectl
from bench.kubeflow import KF_JOB_LABEL

TJ_GROUP, TJ_VERSION, TJ_PLURAL = "torchjob.io", "v1alpha1", "torchjobs"
KF_GROUP, KF_VERSION_API, KF_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
TJ_JOB_LABEL = f"{TJ_GROUP}/job-name"
PODS_PER_JOB = 8
IMAGE = "registry.k8s.io/pause:3.10"
EXIT_CODE_ANNOTATION = "kwok.torchjob.io/exit-code"  # hack/kwok/stages.yaml
POD_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}}
# Requests that an operator or an agent makes about jobs (leases and node heartbeats are not).
JOB_RESOURCES = frozenset(
    {"pods", "torchjobs", "pytorchjobs", "events", "services", "endpoints", "serviceaccounts",
     "roles", "rolebindings", "podgroups", "configmaps"}
)  # fmt: skip


def bench_nodes(pods: int) -> list[dict[str, Any]]:
    """Extra fake CPU nodes (kwok) for ``pods`` pods, 1000 pods each."""
    nodes = []
    for i in range(math.ceil(pods / 1000) + 1):
        res = {"cpu": "200", "memory": "1Ti", "pods": "1000", "ephemeral-storage": "1Ti"}
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"bench-cpu-{i}",
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": f"bench-cpu-{i}",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "status": {"allocatable": res, "capacity": res},
            }
        )
    return nodes


def pod_template(container: str) -> dict[str, Any]:
    return {
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": container, "image": IMAGE, "resources": POD_RESOURCES}],
        }
    }


def torchjob_manifest(name: str) -> dict[str, Any]:
    """Defaults as a user gets them (failurePolicy: 3 restarts, 10 s initial backoff)."""
    return {
        "apiVersion": f"{TJ_GROUP}/{TJ_VERSION}",
        "kind": "TorchJob",
        "metadata": {"name": name},
        "spec": {"replicas": PODS_PER_JOB, "template": pod_template("trainer")},
    }


def pytorchjob_manifest(name: str) -> dict[str, Any]:
    """restartPolicy ExitCode: Kubeflow recreates a pod whose exit code is retryable (>=128)."""
    spec = {"restartPolicy": "ExitCode", "template": pod_template("pytorch")}
    return {
        "apiVersion": f"{KF_GROUP}/{KF_VERSION_API}",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, **spec},
                "Worker": {"replicas": PODS_PER_JOB - 1, **spec},
            }
        },
    }


@dataclass(frozen=True)
class Flavor:
    """What differs between the two operators, for the benchmark's purposes."""

    key: str
    label: str
    group: str
    version: str
    plural: str
    job_label: str
    manifest: Callable[[str], dict[str, Any]]
    rank0: Callable[[str], str]
    worker: Callable[[str], str]
    exit_code: int

    def job_running(self, obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        if self.key == "tj":
            return bool(status.get("phase") == "Running")
        return any(
            c.get("type") == "Running" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )


TJ = Flavor(
    "tj", "torchjob", TJ_GROUP, TJ_VERSION, TJ_PLURAL, TJ_JOB_LABEL, torchjob_manifest,
    lambda j: f"{j}-worker-0", lambda j: f"{j}-worker-3", 1,
)  # fmt: skip
KF = Flavor(
    "kf", "Kubeflow", KF_GROUP, KF_VERSION_API, KF_PLURAL, KF_JOB_LABEL, pytorchjob_manifest,
    lambda j: f"{j}-master-0", lambda j: f"{j}-worker-2", 137,
)  # fmt: skip


def apiserver_requests(kubeconfig: Path) -> float:
    """Finished non-watch requests on job-related resources, from the API server's metrics."""
    total = 0.0
    for line in kubectl(kubeconfig, "get", "--raw", "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_part, value = line.rsplit(" ", 1)
        labels = dict(
            kv.split("=", 1) for kv in labels_part[len("apiserver_request_total{") : -1].split(",")
        )
        resource = labels.get("resource", "").strip('"')
        verb = labels.get("verb", "").strip('"')
        if resource in JOB_RESOURCES and verb not in ("WATCH", "CONNECT"):
            total += float(value)
    return total
