"""A TorchTune study on the kwok control plane: applied with kubectl, reconciled by the
operator, its trials TorchJobs, median pruning from the trials' ``status.progress``, and the
operator SIGKILLed in the middle: every trial counted once.

kwok pods run no code, so this test plays each trial's rank 0: it writes the trial's reports
into the TorchJob's ``status.progress`` as the runtime's reporter does (a ``Progress``
object, what ``torchjob.train.job_status.progress_body`` sends), and ends a good trial through
kwok's exit stage. A good trial reports step 1, waits until the study has recorded it (so the
median pruner has a value at step 1 to compare with), then reports step 3 and exits 0. A bad
trial reports a poor step 1 and waits to be pruned.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION, Progress
from torchjob.api.torchtune import PLURAL as TUNE_PLURAL

pytestmark = pytest.mark.cluster

STUDY_LABEL = "torchjob.io/tune-study"
GOOD = (1.0, 2.0)


def study(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchTune",
        "metadata": {"name": name},
        "spec": {
            "searchSpace": [{"name": "x", "type": "grid", "values": [1.0, 2.0, 3.0, 4.0]}],
            "sampler": {"type": "grid"},
            "objective": {"metric": "loss", "mode": "min"},
            "pruner": {"type": "median", "startupTrials": 2, "warmupSteps": 0},
            "parallelism": 2,
            "trialTemplate": {"spec": torchjob("trial", replicas=2)["spec"]},
        },
    }


class Player:
    """Plays rank 0 of every trial of one study; SIGKILLs the operator once, mid-study."""

    def __init__(self, jobs: Jobs, name: str, *, kill: bool = True) -> None:
        self.jobs = jobs
        self.name = name
        self.stage: dict[str, int] = {}
        self.x: dict[str, float] = {}
        self.seen: set[str] = set()
        self.max_live = 0
        self.killed = not kill

    def tune(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.jobs.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.jobs.ns, TUNE_PLURAL, self.name
        )
        return obj

    def _progress(self, job: str, step: int, loss: float) -> None:
        body = Progress(
            step=step, metrics={"loss": loss}, last_checkpoint=f"/checkpoints/{job}/{step}"
        ).to_wire()
        self.jobs.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.jobs.ns, PLURAL, job, {"status": {"progress": body}}
        )

    def tick(self) -> bool:
        status = self.tune().get("status") or {}
        recorded = {t["name"]: t for t in status.get("trials") or []}
        if not self.killed and (status.get("trialsSucceeded") or 0) >= 1:
            self.killed = True
            self.jobs.operator.kill()
            self.jobs.operator.start()
        listed = self.jobs.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.jobs.ns, PLURAL, label_selector=f"{STUDY_LABEL}={self.name}"
        )["items"]
        live = [j for j in listed if not j["metadata"].get("deletionTimestamp")]
        live = [j for j in live if (j.get("status") or {}).get("phase") != "Succeeded"]
        self.max_live = max(self.max_live, len(live))
        for job in listed:
            name = job["metadata"]["name"]
            self.seen.add(name)
            if job["metadata"].get("deletionTimestamp"):
                continue
            env = job["spec"]["template"]["spec"]["containers"][0]["env"]
            x = float(
                json.loads(next(e["value"] for e in env if e["name"] == contract.TUNE_CONFIG))["x"]
            )
            self.x[name] = x
            stage = self.stage.get(name, 0)
            if stage == 0:
                pods = self.jobs.pods(name)
                if len(pods) == 2 and all(p.status.phase == "Running" for p in pods):
                    self._progress(name, 1, x if x in GOOD else 10 * x)
                    self.stage[name] = 1
            elif stage == 1 and x in GOOD and (recorded.get(name) or {}).get("step") == 1:
                self._progress(name, 3, x / 3)
                for p in self.jobs.pods(name):
                    self.jobs.exit_pod(p.metadata.name, 0)
                self.stage[name] = 2
        return status.get("phase") in ("Succeeded", "Failed")


def test_a_torchtune_runs_prunes_and_survives_an_operator_sigkill_with_exact_counts(
    jobs: Jobs,
) -> None:
    name = "kwok-tune"
    jobs.apply(study(name))
    player = Player(jobs, name)
    k.wait_for(
        player.tick,
        180,
        lambda: f"the study to finish; {player.tune().get('status')}",
        interval=0.3,
    )
    status = player.tune()["status"]
    assert player.killed, "the operator was SIGKILLed mid-study"
    assert player.x, "the player played the trials"
    assert status["phase"] == "Succeeded", status
    counts = {
        key: status[key]
        for key in (
            "trialsCreated",
            "trialsRunning",
            "trialsSucceeded",
            "trialsPruned",
            "trialsFailed",
        )
    }
    assert counts == {
        "trialsCreated": 4,
        "trialsRunning": 0,
        "trialsSucceeded": 2,
        "trialsPruned": 2,
        "trialsFailed": 0,
    }, status
    # Exactly four TorchJobs were ever made, one per grid point, at most 2 running at once.
    assert player.seen == {f"{name}-t{i}" for i in range(4)}
    assert sorted(player.x.values()) == [1.0, 2.0, 3.0, 4.0]
    assert player.max_live <= 2
    by_x = {player.x[t["name"]]: t for t in status["trials"]}
    assert {x: t["state"] for x, t in by_x.items()} == {
        1.0: "Succeeded",
        2.0: "Succeeded",
        3.0: "Pruned",
        4.0: "Pruned",
    }
    best = status["bestTrial"]
    assert best["params"] == {"x": 1.0}
    assert best["value"] == pytest.approx(1 / 3)
    assert best["checkpoint"] == f"/checkpoints/{best['name']}/3"
    # Pruned trials' TorchJobs are deleted (pruneAction Delete); the good ones stay, Succeeded.
    for x, t in by_x.items():
        if x in GOOD:
            assert jobs.status(t["name"])["phase"] == "Succeeded"
        else:
            k.wait_for(lambda n=t["name"]: jobs.get(n) is None, 60, f"{t['name']} deleted")
    # kubectl get tt shows the progress and the best value.
    table = jobs.kubectl("get", "tt", name).stdout
    print(table)
    assert "Succeeded" in table and "4/4" in table and "0.333" in table, table
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True", "Complete": "True"}


def test_python_submits_a_study_and_a_new_process_attaches_to_its_results(
    jobs: Jobs,
) -> None:
    """``tune.submit`` from a Tuner-style param_space; ``tune.attach(name)`` (what a notebook
    that closed and reopened does) reads the same study back as a ResultGrid."""
    from torchjob import tune

    kubeconfig = str(jobs.cluster.kubeconfig)
    manifest = tune.study_manifest(
        "py-tune",
        {"x": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
        metric="loss",
        mode="min",
        template=torchjob("trial", replicas=2),
        max_concurrent_trials=2,
        pruner="median",
    )
    manifest["spec"]["pruner"]["startupTrials"] = 2
    submitted = tune.submit(manifest, namespace=jobs.ns, kubeconfig=kubeconfig)
    player = Player(jobs, "py-tune", kill=False)
    k.wait_for(
        player.tick,
        180,
        lambda: f"the study to finish; {player.tune().get('status')}",
        interval=0.3,
    )
    grid = tune.attach("py-tune", namespace=jobs.ns, kubeconfig=kubeconfig).wait(
        timeout_s=k.scaled(30)
    )
    assert submitted.status["phase"] == "Succeeded"
    assert [r.status for r in grid] == ["TERMINATED", "TERMINATED", "PRUNED", "PRUNED"]
    best = grid.get_best_result()
    assert best.config == {"x": 1.0} and best.metrics["loss"] == pytest.approx(1 / 3)
    assert best.checkpoint is not None and best.checkpoint.path == f"/checkpoints/{best.job_name}/3"


def test_tune_run_with_the_cluster_backend_submits_a_torchtune_and_follows_it(
    jobs: Jobs,
) -> None:
    """``tune.run(..., tune_config=TuneConfig(backend="cluster"))``: the search is a TorchTune
    the operator runs (a constant in the config travels as a one-value categorical, the pruner
    is the TorchTune's spec.pruner), and the call returns its analysis once it is done."""
    from torchjob import tune

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["analysis"] = tune.run(
                None,
                config={"x": tune.grid_search([1.0, 2.0, 3.0, 4.0]), "epochs": 3},
                metric="loss",
                mode="min",
                scheduler={"type": "median", "startupTrials": 2},
                max_concurrent_trials=2,
                name="run-tune",
                verbose=0,
                tune_config=tune.TuneConfig(
                    backend="cluster",
                    template=torchjob("trial", replicas=2),
                    namespace=jobs.ns,
                    kubeconfig=str(jobs.cluster.kubeconfig),
                    poll_interval_s=0.3,
                ),
            )
        except BaseException as e:  # surfaced by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    player = Player(jobs, "run-tune", kill=False)

    def finished() -> bool:
        player.tick()
        return not thread.is_alive()

    # The TorchTune appears a moment after tune.run starts: until then tick() reads a 404.
    k.wait_for(
        finished,
        180,
        lambda: f"tune.run to return; {outcome}",
        interval=0.3,
        ignore=(ApiException,),
    )
    assert "error" not in outcome, outcome.get("error")
    analysis: tune.ExperimentAnalysis = outcome["analysis"]
    by_x = {t.config["x"]: t for t in analysis.trials}
    assert {x: t.status for x, t in by_x.items()} == {
        1.0: "TERMINATED",
        2.0: "TERMINATED",
        3.0: "PRUNED",
        4.0: "PRUNED",
    }
    assert analysis.best_config == {"x": 1.0, "epochs": 3}
    best = analysis.get_best_trial()
    assert best is not None and best.result.job_name is not None
    assert analysis.best_checkpoint is not None
    assert analysis.best_checkpoint.path == f"/checkpoints/{best.result.job_name}/3"
    # It was a TorchTune: the operator's status says so, and every trial got the constant.
    status = player.tune()["status"]
    assert status["phase"] == "Succeeded" and status["trialsCreated"] == 4
    assert {t["params"]["epochs"] for t in status["trials"]} == {3}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"searchSpace": []}, "spec.searchSpace must list at least one parameter"),
        (
            {"sampler": {"type": "tpe"}},
            "spec.sampler.type must be grid when spec.searchSpace has a grid parameter",
        ),
        # categorical and grid need values: the schema's anyOf (CEL cannot see values).
        ({"searchSpace": [{"name": "x", "type": "grid"}]}, "spec.searchSpace[0].values: Required"),
        (
            {"searchSpace": [{"name": "x", "type": "categorical"}]},
            "spec.searchSpace[0].values: Required value",
        ),
        (
            {"searchSpace": [{"name": "x", "type": "categorical", "values": []}]},
            "spec.searchSpace[0].values in body should have at least 1 items",
        ),
        ({"trialTemplate": {"spec": {"replicas": 2}}}, "spec.trialTemplate.spec.template"),
        (
            {"trialTemplate": {"spec": {**torchjob("t")["spec"], "replicas": 0}}},
            "spec.trialTemplate.spec.replicas",
        ),
    ],
)
def test_bad_studies_are_rejected_at_apply_naming_the_field(
    jobs: Jobs, change: dict[str, Any], message: str
) -> None:
    body = study("bad")
    body["spec"].update(change)
    import yaml

    done = jobs.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
