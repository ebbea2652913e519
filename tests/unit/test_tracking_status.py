"""The pure pieces of experiment tracking: what rank 0 writes into ``status.tracking``, that the
operator's status patch never clears it, the CRD keeps it, and when a pod's env turns MLflow on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from torchjob import contract
from torchjob.api.models import TorchJobStatus
from torchjob.contract import PodEnv
from torchjob.tracking import Callback, Callbacks, MLflowLoggerCallback, TrialInfo
from torchjob.tracking.mlflow import numeric_metrics, redact
from torchjob.train.tracking import env_callbacks, status_tracking, worker_env

REPO = Path(__file__).resolve().parents[2]


def _pod() -> PodEnv:
    env = {
        contract.JOB_NAME: "job",
        contract.NAMESPACE: "ns",
        contract.POD_INDEX: "0",
        contract.REPLICAS: "1",
        contract.NPROC_PER_NODE: "1",
        contract.GENERATION: "0",
        contract.RDZV_HOST: "job-worker-0.job",
        contract.RDZV_PORT: "29500",
    }
    pod = PodEnv.from_env(env)
    assert pod is not None
    return pod


def test_status_tracking_names_the_run_and_never_the_credentials() -> None:
    trial = TrialInfo("job")
    assert status_tracking(trial) is None
    trial.tracking.update(
        mlflow_run_id="abc",
        mlflow_experiment_id="1",
        mlflow_tracking_uri=redact("https://user:secret@mlflow.example:5000/x"),
    )
    assert status_tracking(trial) == {
        "backend": "mlflow",
        "runId": "abc",
        "experimentId": "1",
        "trackingUri": "https://mlflow.example:5000/x",
    }
    assert worker_env(trial, []) == {"MLFLOW_RUN_ID": "abc"}
    failed = TrialInfo(
        "job", tracking={"error": "MLflow tracking server http://x:1 cannot be reached"}
    )
    assert status_tracking(failed) == {"backend": "mlflow", "error": failed.tracking["error"]}


def test_the_operators_status_patch_leaves_tracking_to_the_pod() -> None:
    status = TorchJobStatus.parse({"phase": "Running", "tracking": {"runId": "abc"}})
    assert status.tracking is not None and status.tracking.run_id == "abc"
    assert "tracking" not in status.to_patch() and "progress" not in status.to_patch()


def test_the_crd_keeps_status_tracking() -> None:
    crd = yaml.safe_load((REPO / "crds" / "torchjob.io_torchjobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    tracking = schema["properties"]["status"]["properties"]["tracking"]["properties"]
    assert {"runId", "experimentId", "trackingUri", "error"} <= set(tracking)


def test_mlflow_tracking_uri_in_a_pods_env_turns_mlflow_on() -> None:
    uri = {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}
    (cb,) = env_callbacks([], _pod(), uri)
    assert isinstance(cb, MLflowLoggerCallback)
    assert cb.tracking_uri == "http://mlflow:5000" and cb.experiment_name == "job"
    named = env_callbacks([], _pod(), {**uri, "MLFLOW_EXPERIMENT_NAME": "team"})
    assert named[0].experiment_name == "team"
    assert env_callbacks([], None, uri) == []  # on a laptop: RunConfig(callbacks=...) only
    assert env_callbacks([], _pod(), {**uri, contract.MLFLOW_AUTOLOG: "false"}) == []
    mine = MLflowLoggerCallback("http://other:5000")
    assert env_callbacks([mine], _pod(), uri) == [mine]


def test_a_failing_callback_is_logged_and_the_others_still_run() -> None:
    seen: list[str] = []

    class Broken(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    class Recording(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):  # type: ignore[no-untyped-def]
            seen.append(f"{trial}:{iteration}:{result['loss']}")

    callbacks = Callbacks([Broken(), Recording()])
    trial = TrialInfo("t")
    callbacks.trial_start(trial)
    callbacks.trial_result(trial, {"loss": 1.0})
    callbacks.trial_result(trial, {"loss": 0.5})
    assert seen == ["t:1:1.0", "t:2:0.5"]


def test_numeric_metrics_flattens_and_drops_what_is_not_a_number() -> None:
    assert numeric_metrics({"a": 1, "b": {"c": 2.5}, "s": "x", "f": True}) == {"a": 1.0, "b/c": 2.5}
