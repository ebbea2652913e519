"""A tuning study whose trials are TorchJobs running the real runtime (process kubelet).

``tune.run`` with the cluster backend submits each trial of examples/tune/trial.py as a
TorchJob of 2 pods; the operator creates the pods, the process kubelet (tests/e2e/kubelet.py)
runs them as local processes, each trial's rank 0 reports into its TorchJob's
``status.progress`` with the per-job ServiceAccount, and optuna's ThresholdPruner stops the
trials whose first loss is too high by deleting their TorchJobs. The best config and its
committed checkpoint come back to the caller.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
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


def _template(storage: Path) -> dict:
    """examples/tune/trial-job.yaml, placed on the process kubelet's node."""
    job = yaml.safe_load((REPO / "examples" / "tune" / "trial-job.yaml").read_text())
    job["spec"]["checkpoint"]["path"] = str(storage)
    pod = job["spec"]["template"]["spec"]
    pod["nodeSelector"] = {NODE_LABEL: "true"}
    pod["tolerations"] = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    pod["terminationGracePeriodSeconds"] = 5
    pod["containers"][0]["command"] = [sys.executable, "examples/tune/trial.py"]
    return job


def test_study_of_torchjob_trials_prunes_and_returns_the_best_checkpoint(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    storage = tmp_path / "checkpoints"
    lrs = [0.1, 0.05, 0.001, 0.0005]
    try:
        analysis = tune.run(
            None,
            config={"lr": tune.grid_search(lrs), "epochs": 6, "steps": 10, "epoch_seconds": 0.5},
            metric="loss",
            mode="min",
            scheduler=optuna.pruners.ThresholdPruner(upper=5.0),
            max_concurrent_trials=2,
            name="e2e-study",
            local_dir=str(tmp_path / "results"),
            verbose=0,
            tune_config=tune.TuneConfig(
                backend="cluster",
                template=_template(storage),
                namespace=jobs.ns,
                kubeconfig=str(jobs.cluster.kubeconfig),
                poll_interval_s=0.5,
                trial_timeout_s=240,
            ),
        )
    except tune.TuneError as e:
        pytest.fail(f"{e}\n{kubelet.log_of('e2e-study')}")
    trials = {t.config["lr"]: t for t in analysis.trials}
    statuses = {lr: t.status for lr, t in trials.items()}
    assert statuses == {0.1: "TERMINATED", 0.05: "TERMINATED", 0.001: "PRUNED", 0.0005: "PRUNED"}, (
        f"{[(t.config, t.status, t.result.metrics_history) for t in analysis.trials]}\n"
        f"{kubelet.log_of('e2e-study')}"
    )
    # Each trial ran on 2 pods; the pruned ones were stopped after their first report.
    assert trials[0.001].last_result["training_iteration"] < 6
    # The finished trials' last report is their runtime's last: 6 epochs.
    assert trials[0.1].last_result["epoch"] == 5
    assert trials[0.1].last_result["training_iteration"] == 6

    best = analysis.get_best_trial("loss", "min")
    assert best is not None and best.config["lr"] == 0.1
    assert analysis.best_config == best.config
    # The best checkpoint is the trial's last committed one, in its own directory.
    checkpoint = analysis.best_checkpoint
    job_name = best.result.job_name
    assert job_name is not None
    committed = CheckpointStorage(str(storage / job_name)).list_committed()
    assert checkpoint is not None and checkpoint.path == committed[-1].path
    with checkpoint.as_directory() as d:
        weight = torch.load(Path(d) / "model.pt")["weight"].item()
    assert abs(weight - 3.0) < 0.1  # lr 0.1 converged to the optimum w = 3
    # Pruned trials' TorchJobs were deleted, finished ones kept (with their status).
    for lr in (0.001, 0.0005):
        name = trials[lr].result.job_name
        assert name is not None
        k.wait_for(lambda n=name: jobs.get(n) is None, 60, f"TorchJob {name} deleted")
    assert jobs.status(job_name)["phase"] == "Succeeded"
