"""examples/tune/torchtune.yaml applied with kubectl: a 4-trial study of the Tune seed's
trainable (examples/tune/trial.py) that the operator runs, each trial a TorchJob of 2 pods
running the real runtime (the process kubelet, tests/e2e/kubelet.py, runs the pods as local
processes), the threshold pruner deleting the trials whose loss is too high, to the best
trial's committed checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from tests import kube as k
from tests.cluster.operator_harness import REPO, Jobs
from tests.e2e.kubelet import NODE_LABEL, TAINT, ProcessKubelet

from torchjob import tune
from torchjob.checkpoint import CheckpointStorage

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


@pytest.fixture
def kubelet(kube: object, tmp_path: Path) -> Iterator[ProcessKubelet]:
    node = ProcessKubelet(api=kube, node="proc-node-0", workdir=tmp_path / "pods", cwd=REPO)
    node.start()
    yield node
    node.stop()


def test_a_torchtune_applied_with_kubectl_runs_the_seed_trainable_to_the_best_checkpoint(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    storage = tmp_path / "checkpoints"
    study = yaml.safe_load((REPO / "examples" / "tune" / "torchtune.yaml").read_text())
    spec = study["spec"]["trialTemplate"]["spec"]
    spec["checkpoint"]["path"] = str(storage)
    pod = spec["template"]["spec"]
    pod["nodeSelector"] = {NODE_LABEL: "true"}
    pod["tolerations"] = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    pod["terminationGracePeriodSeconds"] = 5
    pod["containers"][0]["command"] = [sys.executable, "examples/tune/trial.py"]
    jobs.apply(study)

    handle = tune.attach("lr-search", namespace=jobs.ns, kubeconfig=str(jobs.cluster.kubeconfig))

    def finished() -> bool:
        return handle.status.get("phase") in ("Succeeded", "Failed")

    k.wait_for(
        finished,
        300,
        lambda: f"the study to end: {handle.status}\n{kubelet.log_of('lr-search')}",
        interval=1.0,
    )
    status = handle.status
    assert status["phase"] == "Succeeded", f"{status}\n{kubelet.log_of('lr-search')}"
    grid = handle.results()
    by_lr = {r.config["lr"]: r for r in grid}
    assert {lr: r.status for lr, r in by_lr.items()} == {
        0.1: "TERMINATED",
        0.05: "TERMINATED",
        0.001: "PRUNED",
        0.0005: "PRUNED",
    }, status["trials"]
    assert (status["trialsCreated"], status["trialsSucceeded"], status["trialsPruned"]) == (4, 2, 2)
    # The finished trials reported every epoch (6), the pruned ones were stopped early.
    assert by_lr[0.1].metrics["training_iteration"] == 6
    assert by_lr[0.001].metrics["training_iteration"] < 6
    # The best trial's checkpoint is its last committed one, and holds the trained model.
    best = grid.get_best_result()
    assert best.config["lr"] == 0.1 and best.job_name == status["bestTrial"]["name"]
    committed = CheckpointStorage(str(storage / best.job_name)).list_committed()
    assert best.checkpoint is not None and best.checkpoint.path == committed[-1].path
    with best.checkpoint.as_directory() as d:
        weight = torch.load(Path(d) / "model.pt")["weight"].item()
    assert abs(weight - 3.0) < 0.1
    for lr in (0.001, 0.0005):
        name = by_lr[lr].job_name
        assert name is not None
        k.wait_for(lambda n=name: jobs.get(n) is None, 60, f"pruned TorchJob {name} deleted")
    table = jobs.kubectl("get", "tt", "lr-search").stdout
    assert "Succeeded" in table and "4/4" in table, table
