"""Operator and runtime end to end: the operator's pods run the real torchjob runtime.

A process kubelet (tests/e2e/kubelet.py) plays the kubelet of one node, so the
worker pods the operator creates become local processes with the env contract.
Generation 0 crashes a rank mid-training; the operator restarts the group
(a failure, charged to maxRestarts); generation 1 resumes from the checkpoint
rank 0 committed and the job succeeds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests import kube as k
from tests.cluster.operator_harness import REPO, Jobs, torchjob, worker_template
from tests.e2e.kubelet import NODE_LABEL, TAINT, ProcessKubelet

from torchjob.checkpoint import CheckpointStorage

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


@pytest.fixture
def kubelet(kube: object, tmp_path: Path) -> Iterator[ProcessKubelet]:
    node = ProcessKubelet(api=kube, node="proc-node-0", workdir=tmp_path / "pods", cwd=REPO)
    node.start()
    yield node
    node.stop()


def test_worker_crash_restarts_group_and_resumes_from_checkpoint(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    storage = tmp_path / "checkpoints"
    template = worker_template(
        nodeSelector={NODE_LABEL: "true"},
        tolerations=[{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
        terminationGracePeriodSeconds=10,
    )
    container = template["spec"]["containers"][0]
    container["command"] = [sys.executable, "tests/e2e/train_job.py"]
    container["args"] = ["6", "3"]
    manifest = torchjob(
        "e2e",
        replicas=2,
        backend="gloo",
        template=template,
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 1}},
    )
    jobs.apply(manifest)

    def finished() -> dict | None:
        status = jobs.status("e2e")
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = k.wait_for(
        finished,
        300,
        lambda: f"e2e job to finish\n{jobs.describe('e2e')}\n{kubelet.log_of('e2e')}",
        interval=0.5,
    )
    logs = kubelet.log_of("e2e-worker-0")
    assert status["phase"] == "Succeeded", f"{jobs.describe('e2e')}\n{kubelet.log_of('e2e')}"
    assert status["restarts"] == 1 and status["disruptions"] == 0
    assert status["currentGeneration"] == 1
    # Both pods fail within the same second: rank 1 dies, and rank 0's collective breaks.
    # Pod 0's runtime says in its termination message that it only lost a peer, so the
    # operator blames pod 1 and quotes pod 1's own summary.
    assert status["lastFailure"]["pod"] == "e2e-worker-1", jobs.describe("e2e")
    assert status["lastFailure"]["exitCode"] != 0
    assert status["lastFailure"]["message"] == "rank 1 worker process died: exit code 1"
    failed = [e for e in jobs.wait_events("e2e", "WorkerFailed") if e.reason == "WorkerFailed"]
    assert "e2e-worker-1 exited with code 1 (Error): rank 1 worker process died" in (
        failed[0].message
    )
    assert "rank 1 crashing at epoch 3" in kubelet.log_of("e2e-worker-1")
    # Generation 1 picked up where generation 0 left off (epoch 2 or 3 committed), not at 0.
    assert (
        "resumed from epoch 2 at generation 1" in logs
        or "resumed from epoch 3 at generation 1" in logs
    ), logs
    assert "done: 6 epochs, world size 2" in logs
    committed = CheckpointStorage(str(storage)).list_committed()
    assert committed, f"no committed checkpoint under {storage}"

    # Rank 0 reported its progress into the TorchJob's status with the per-job ServiceAccount.
    progress = status.get("progress") or {}
    assert progress.get("epoch") == 5, f"{status}\n{kubelet.log_of('e2e-worker-0')}"
    assert progress.get("lastCheckpoint") == committed[-1].path
    assert "loss" in progress.get("metrics", {})
    header, row = jobs.kubectl("get", "tj", "e2e", "-o", "wide").stdout.strip().splitlines()
    assert row.split()[header.split().index("EPOCH")] == "5"
    account = f"--as=system:serviceaccount:{jobs.ns}:e2e-worker"
    own = ("auth", "can-i", "patch", "torchjobs.torchjob.io/e2e", "--subresource=status", account)
    other = (
        "auth",
        "can-i",
        "patch",
        "torchjobs.torchjob.io/other",
        "--subresource=status",
        account,
    )
    assert jobs.kubectl(*own, check=False).stdout.strip() == "yes"
    assert jobs.kubectl(*other, check=False).stdout.strip() == "no", "limited to its own job"
    assert (
        jobs.kubectl("auth", "can-i", "list", "pods", account, check=False).stdout.strip() == "no"
    )
