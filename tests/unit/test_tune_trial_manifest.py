"""The pure parts of tuning on the cluster: a trial's TorchJob, and reading status.progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from torchjob import contract, tune
from torchjob.api.models import TorchJob
from torchjob.train.job_status import progress_body
from torchjob.tune import cluster

TEMPLATE = {
    "apiVersion": "torchjob.io/v1alpha1",
    "kind": "TorchJob",
    "metadata": {"name": "tpl", "labels": {"team": "a"}},
    "spec": {
        "replicas": 2,
        "checkpoint": {"path": "s3://bucket/runs"},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": "img",
                        "env": [{"name": contract.TUNE_CONFIG, "value": "stale"}],
                    },
                    {"name": "sidecar", "image": "img"},
                ]
            }
        },
    },
}


def test_trial_manifest_carries_the_config_name_labels_and_its_own_checkpoint_dir() -> None:
    body = cluster.trial_manifest(
        TEMPLATE,
        study="My_Study",
        trial_id="00003",
        config={"lr": 0.1, "train_loop_config": {"epochs": 2}},
        namespace="ns",
        resources={"workers": 4, "nproc_per_node": 2},
    )
    assert body["metadata"]["name"] == "my-study-t00003"
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["labels"] == {
        "team": "a",
        cluster.STUDY_LABEL: "My_Study",
        cluster.TRIAL_LABEL: "00003",
    }
    for c in body["spec"]["template"]["spec"]["containers"]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert json.loads(env[contract.TUNE_CONFIG]) == {
            "lr": 0.1,
            "train_loop_config": {"epochs": 2},
        }
        assert env[contract.TUNE_TRIAL] == "00003"
    assert body["spec"]["checkpoint"]["path"] == "s3://bucket/runs/my-study-t00003"
    assert (body["spec"]["replicas"], body["spec"]["nprocPerNode"]) == (4, 2)
    TorchJob.model_validate(body)  # still a valid TorchJob
    assert TEMPLATE["metadata"]["name"] == "tpl", "the template itself is not changed"


def test_trial_manifest_rejects_unknown_resources_and_empty_templates() -> None:
    with pytest.raises(ValueError, match="resources_per_trial\\['memory'\\]"):
        cluster.trial_manifest(
            TEMPLATE, study="s", trial_id="0", config={}, namespace=None, resources={"memory": 1}
        )
    with pytest.raises(ValueError, match="containers is empty"):
        cluster.trial_manifest(
            {"spec": {"template": {"spec": {"containers": []}}}},
            study="s",
            trial_id="0",
            config={},
            namespace=None,
        )


def test_template_from_a_yaml_path_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(TEMPLATE))
    assert cluster.template_dict(str(path))["metadata"]["name"] == "tpl"
    with pytest.raises(TypeError, match=r"TuneConfig\.template"):
        cluster.template_dict(42)


def test_progress_report_reads_what_the_runtime_writes() -> None:
    assert cluster.progress_report({"status": {}}) is None
    body = progress_body({"loss": 0.5, "epoch": 3, "_hidden": 1}, reports=7, checkpoint="/c/7")
    report = cluster.progress_report({"status": {"progress": body}})
    assert report == cluster.ProgressReport(
        step=7, metrics={"loss": 0.5, "epoch": 3}, checkpoint="/c/7"
    )


def test_cluster_tuner_needs_a_template_and_a_known_prune_action() -> None:
    with pytest.raises(ValueError, match="needs template="):
        tune.Tuner(None, tune_config=tune.TuneConfig(backend="cluster"))
    with pytest.raises(ValueError, match="cluster_prune"):
        tune.Tuner(
            None,
            tune_config=tune.TuneConfig(backend="cluster", template=TEMPLATE, cluster_prune="x"),
        )
    with pytest.raises(ValueError, match="backend must be"):
        tune.Tuner(lambda c: None, tune_config=tune.TuneConfig(backend="ray"))


def test_trial_config_reaches_a_torch_trainer_in_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchjob.train.trainer import TorchTrainer, _as_trial

    trainer = TorchTrainer(lambda c: None, train_loop_config={"lr": 1.0, "epochs": 3})
    assert _as_trial(trainer) is trainer
    monkeypatch.setenv(contract.TUNE_CONFIG, json.dumps({"lr": 0.1, "train_loop_config": {"b": 2}}))
    assert tune.get_trial_config() == {"lr": 0.1, "train_loop_config": {"b": 2}}
    assert _as_trial(trainer).train_loop_config == {"lr": 0.1, "epochs": 3, "b": 2}
    assert trainer.train_loop_config == {"lr": 1.0, "epochs": 3}
    monkeypatch.setenv(contract.TUNE_CONFIG, "[1]")
    with pytest.raises(ValueError, match=contract.TUNE_CONFIG):
        tune.get_trial_config()


def test_a_studys_flat_parameters_nest_into_the_trials_config() -> None:
    from torchjob.plan.trial import nested_config

    flat = {"train_loop_config/lr": 0.1, "train_loop_config/opt/beta": 0.9, "seed": 3}
    assert nested_config(flat) == {
        "train_loop_config": {"lr": 0.1, "opt": {"beta": 0.9}},
        "seed": 3,
    }
    assert nested_config({}) == {}
