"""The real-node tests' operator and jobs (tests/cluster/test_real_node.py, test_node_faults.py):
the operator installed by `helm install` on the real nodes, and a worker pod template that runs
one of tests/e2e's scripts in the CPU runtime image. tests/cluster/conftest.py makes the
fixtures available to every module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests import kube as k
from tests.cluster.operator_harness import Jobs
from tests.cluster.realnode import (
    NODE_LABEL,
    REPO,
    TOLERATION,
    HelmOperator,
    RealNode,
    image,
    tell,
)

SCRIPTS = REPO / "tests" / "e2e"
OPERATOR_NS = "torchjob-system"


@pytest.fixture(scope="module")
def helm_operator(
    cluster: k.Cluster,
    core_v1: Any,
    real_node: RealNode,
    tmp_path_factory: pytest.TempPathFactory,
    stop_process_operators: Callable[[], None],
    pytestconfig: pytest.Config,
) -> Iterator[HelmOperator]:
    # One operator at a time: the process operator of other tests stops (``jobs`` restarts it).
    stop_process_operators()
    t = time.monotonic()
    op = HelmOperator(cluster, core_v1, OPERATOR_NS, "torchjob")
    op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
    op.install(tmp_path_factory.mktemp("helm") / "values.yaml", "--create-namespace")
    cluster.wait_established("torchjobs.torchjob.io", "torchtunes.torchjob.io")
    tell(pytestconfig, f"the operator installed by Helm, Ready in {time.monotonic() - t:.0f}s")
    yield op
    op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)


@pytest.fixture
def real_jobs(cluster: k.Cluster, kube: Any, namespace: str, helm_operator: HelmOperator) -> Jobs:
    return Jobs(cluster, kube, namespace, helm_operator)  # type: ignore[arg-type]


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoints"
    path.mkdir()
    path.chmod(0o777)  # the runtime image runs as uid 1000
    return path


def real_template(
    storage: Path,
    *args: str,
    grace: int = 10,
    env: dict[str, str] | None = None,
    script: str = "train_job.py",
    scripts: Path = SCRIPTS,
) -> dict[str, Any]:
    """A worker pod on the real node running ``scripts/script`` (tests/e2e/train_job.py by
    default) in the runtime image, the scripts' directory mounted from the host."""
    return {
        "spec": {
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "trainer",
                    "image": image("runtime-cpu"),
                    "imagePullPolicy": "Never",
                    "command": ["python3", str(scripts / script), *args],
                    "env": [
                        {"name": "OMP_NUM_THREADS", "value": "1"},
                        *({"name": n, "value": v} for n, v in (env or {}).items()),
                    ],
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    "volumeMounts": [
                        {"name": "scripts", "mountPath": str(scripts), "readOnly": True},
                        {"name": "checkpoints", "mountPath": str(storage)},
                    ],
                }
            ],
            "volumes": [
                {"name": "scripts", "hostPath": {"path": str(scripts), "type": "Directory"}},
                {"name": "checkpoints", "hostPath": {"path": str(storage), "type": "Directory"}},
            ],
        }
    }


def logs(jobs: Jobs, pod: str, *extra: str) -> str:
    out = jobs.kubectl("logs", pod, *extra, check=False)
    return out.stdout + out.stderr


def wait_finished(jobs: Jobs, name: str, timeout: float = 420) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    return k.wait_for(  # type: ignore[no-any-return]
        finished, timeout, lambda: f"{name} to finish\n{pod_logs(jobs, name)}", interval=1.0
    )


def pod_logs(jobs: Jobs, name: str) -> str:
    """The job's description and the last lines of each of its pods' logs (failure messages)."""
    pods = "\n".join(
        f"--- kubectl logs {p.metadata.name}:\n{logs(jobs, p.metadata.name, '--tail=15')}"
        for p in jobs.pods(name)
    )
    return f"{jobs.describe(name)}\n{pods}"
