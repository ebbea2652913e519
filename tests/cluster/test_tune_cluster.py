"""Tuning whose trials are TorchJobs, on the kwok control plane.

kwok pods run no code, so this test plays every trial's rank 0: once a trial's
two pods run, it writes the trial's reports into the TorchJob's
``status.progress`` exactly as the runtime's reporter does
(``torchjob.train.job_status.progress_body``), then ends a good trial through
kwok's exit stage (both pods exit 0, the operator marks the job Succeeded) and
leaves a bad one running: optuna's median pruner must stop it, which here suspends
its TorchJob (``cluster_prune="suspend"``: the operator deletes the pods, the object and its
status stay). The real runtime, with pruned trials deleted, is tests/cluster/test_e2e_tune.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

from torchjob import contract, tune
from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob.train.job_status import progress_body
from torchjob.tune.cluster import STUDY_LABEL

pytestmark = pytest.mark.cluster

GOOD = (1.0, 2.0)  # trials whose pods this test makes succeed; the others wait to be pruned


def _trial_config(job: dict[str, Any]) -> dict[str, Any]:
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    raw = next(e["value"] for e in env if e["name"] == contract.TUNE_CONFIG)
    config: dict[str, Any] = json.loads(raw)
    return config


class Rank0Player:
    """Plays rank 0 of every trial TorchJob of one study in ``jobs.ns``."""

    def __init__(self, jobs: Jobs, study: str) -> None:
        self.jobs = jobs
        self.study = study
        self.played: dict[str, float] = {}
        self.checkpoints: dict[str, str] = {}
        self.max_in_flight = 0

    def _patch_progress(self, name: str, step: int, loss: float, checkpoint: str) -> None:
        body = progress_body({"loss": loss, "epoch": step - 1}, reports=step, checkpoint=checkpoint)
        self.jobs.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.jobs.ns, PLURAL, name, {"status": {"progress": body}}
        )

    def tick(self) -> None:
        listed = self.jobs.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.jobs.ns, PLURAL, label_selector=f"{STUDY_LABEL}={self.study}"
        )["items"]
        in_flight = [
            j
            for j in listed
            if not j["metadata"].get("deletionTimestamp")
            and not (j["spec"].get("runPolicy") or {}).get("suspend")
            and (j.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        self.max_in_flight = max(self.max_in_flight, len(in_flight))
        for job in in_flight:
            name = job["metadata"]["name"]
            if name in self.played:
                continue
            pods = self.jobs.pods(name)
            if len(pods) != 2 or any(p.status.phase != "Running" for p in pods):
                continue
            x = float(_trial_config(job)["x"])
            self.played[name] = x
            for step in (1, 2, 3):
                checkpoint = f"/checkpoints/{name}/checkpoint_{step:06d}"
                self._patch_progress(name, step, x / step, checkpoint)
            self.checkpoints[name] = checkpoint
            if x in GOOD:
                for p in pods:
                    self.jobs.exit_pod(p.metadata.name, 0)


def test_trials_are_torchjobs_and_the_median_pruner_suspends_the_bad_ones(
    jobs: Jobs, tmp_path: Path
) -> None:
    template = torchjob("trial", replicas=2)
    tuner = tune.Tuner(
        None,
        param_space={"x": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            # optuna's median pruner, once the two good trials (the first two) completed.
            pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
            max_concurrent_trials=2,
            backend="cluster",
            template=template,
            namespace=jobs.ns,
            kubeconfig=str(jobs.cluster.kubeconfig),
            poll_interval_s=0.2,
            trial_timeout_s=120,
            cluster_prune="suspend",
        ),
        run_config=tune.RunConfig(name="kwok-study", storage_path=str(tmp_path), verbose=0),
    )
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["grid"] = tuner.fit()
        except BaseException as e:  # surfaced by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    player = Rank0Player(jobs, "kwok-study")

    def finished() -> bool:
        player.tick()
        return not thread.is_alive()

    k.wait_for(finished, 180, lambda: f"the study to end; played {player.played}", interval=0.2)
    assert "error" not in outcome, outcome.get("error")
    grid: tune.ResultGrid = outcome["grid"]

    by_x = {r.config["x"]: r for r in grid}
    assert {x: r.status for x, r in by_x.items()} == {
        1.0: "TERMINATED",
        2.0: "TERMINATED",
        3.0: "PRUNED",
        4.0: "PRUNED",
    }, [(r.config, r.status, r.metrics_history, r.error) for r in grid]
    # Every trial was a TorchJob of 2 workers, at most 2 of them in flight at once.
    assert sorted(player.played.values()) == [1.0, 2.0, 3.0, 4.0]
    assert player.max_in_flight == 2
    # The completed trials' reports were read from status.progress, step by step.
    good = by_x[1.0]
    assert good.metrics["loss"] == pytest.approx(1 / 3)
    assert good.metrics["training_iteration"] == 3
    # The best config and its checkpoint (status.progress.lastCheckpoint) reach the caller.
    best = grid.get_best_result()
    assert best.config == {"x": 1.0}
    assert best.job_name is not None
    assert best.checkpoint is not None
    assert best.checkpoint.path == player.checkpoints[best.job_name]
    assert jobs.status(best.job_name)["phase"] == "Succeeded"
    # A pruned trial's TorchJob is suspended: the operator deletes its pods, keeps its status.
    for x in (3.0, 4.0):
        name = by_x[x].job_name
        assert name is not None

        def suspended(n: str = name) -> bool:
            return jobs.status(n).get("phase") == "Suspended" and not jobs.pods(n)

        k.wait_for(suspended, 60, f"TorchJob {name} suspended, its pods gone")
        assert jobs.status(name)["progress"]["metrics"]["loss"] == pytest.approx(x / 3)
