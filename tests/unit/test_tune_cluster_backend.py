"""``TuneConfig(backend="cluster")``: what a Tuner or ``tune.run`` submits (a TorchTune), what
it refuses before submitting (naming the setting), and how a trial's config reaches its pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from torchjob import contract, tune
from torchjob.api.torchtune import TorchTune
from torchjob.tune.cluster import study_manifest, template_dict

REPO_ROOT = Path(__file__).resolve().parents[2]

TEMPLATE: dict[str, Any] = {
    "apiVersion": "torchjob.io/v1alpha1",
    "kind": "TorchJob",
    "metadata": {"name": "tpl", "labels": {"team": "a"}},
    "spec": {
        "replicas": 2,
        "elastic": {"minReplicas": 1, "maxReplicas": 2},
        "checkpoint": {"path": "s3://bucket/runs"},
        "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
    },
}


def test_a_cluster_search_is_a_torchtune_with_constants_sizes_and_a_trial_deadline() -> None:
    body = study_manifest(
        "lr-search",
        {
            "lr": tune.grid_search([0.1, 0.01]),
            "epochs": 6,
            "train_loop_config": {"opt": "sgd", "betas": [0.9, 0.99]},
        },
        metric="loss",
        mode="min",
        template=TEMPLATE,
        pruner={"type": "threshold", "upper": 5.0},
        prune_action="suspend",
        resources={"workers": 4, "nproc_per_node": 2, "gpu": 1},
        trial_timeout_s=90.5,
    )
    tt = TorchTune.model_validate(body)
    # Constants travel as one-value categoricals (the trial's config is written by the operator).
    assert body["spec"]["searchSpace"] == [
        {"name": "lr", "type": "grid", "values": [0.1, 0.01]},
        {"name": "epochs", "type": "categorical", "values": [6]},
        {"name": "train_loop_config/opt", "type": "categorical", "values": ["sgd"]},
        {"name": "train_loop_config/betas", "type": "categorical", "values": [[0.9, 0.99]]},
    ]
    assert tt.spec.sampler.type.value == "grid" and tt.spec.max_trials == 2
    assert tt.spec.pruner.type.value == "threshold" and tt.spec.pruner.upper == 5.0
    assert tt.spec.prune_action.value == "Suspend"
    job = body["spec"]["trialTemplate"]["spec"]
    assert (job["replicas"], job["nprocPerNode"]) == (4, 2)
    assert "elastic" not in job, "a size asked for per trial is a fixed size"
    assert job["runPolicy"]["activeDeadlineSeconds"] == 91
    assert body["spec"]["trialTemplate"]["metadata"] == {"labels": {"team": "a"}}
    assert TEMPLATE["spec"]["replicas"] == 2, "the template itself is not changed"


@pytest.mark.parametrize(
    ("settings", "run_config", "message"),
    [
        pytest.param({}, None, "needs template=", id="no-template"),
        pytest.param(
            {"template": TEMPLATE, "metric": "loss", "mode": "min", "cluster_prune": "x"},
            None,
            "cluster_prune",
            id="prune-action",
        ),
        pytest.param({"template": TEMPLATE}, None, "needs metric= and mode=", id="no-objective"),
        pytest.param(
            {"template": TEMPLATE, "metric": "loss", "mode": "min"},
            tune.RunConfig(stop={"training_iteration": 3}),
            r"RunConfig\.stop",
            id="stop",
        ),
        pytest.param(
            {
                "template": TEMPLATE,
                "metric": "loss",
                "mode": "min",
                "pruner": optuna.pruners.MedianPruner(),
            },
            None,
            "an optuna pruner object runs only in this process",
            id="optuna-pruner-object",
        ),
        pytest.param(
            {
                "template": TEMPLATE,
                "metric": "loss",
                "mode": "min",
                "search_alg": optuna.samplers.TPESampler(),
            },
            None,
            "search_alg: a TorchTune takes one of",
            id="optuna-sampler-object",
        ),
    ],
)
def test_a_cluster_tuner_refuses_what_a_torchtune_cannot_hold_before_submitting(
    settings: dict[str, Any], run_config: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        tune.Tuner(
            None,
            param_space={"lr": tune.uniform(0.0, 1.0)},
            tune_config=tune.TuneConfig(backend="cluster", **settings),
            run_config=run_config,
        )


def test_a_trainable_for_the_cluster_other_backends_and_a_cluster_pruner_locally_are_refused() -> (
    None
):
    with pytest.raises(ValueError, match="pass None as the trainable, not function"):
        tune.Tuner(
            lambda c: None,
            tune_config=tune.TuneConfig(
                backend="cluster", template=TEMPLATE, metric="loss", mode="min"
            ),
        )
    with pytest.raises(ValueError, match="backend must be"):
        tune.Tuner(lambda c: None, tune_config=tune.TuneConfig(backend="ray"))
    with pytest.raises(ValueError, match=r"spec\.pruner dict is for backend='cluster'"):
        tune.run(
            lambda c: None,
            config={"x": tune.uniform(0, 1)},
            metric="loss",
            mode="min",
            scheduler={"type": "threshold", "upper": 1.0},
            verbose=0,
        )


def test_constants_that_are_not_json_and_unknown_resources_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"param_space\['fn'\]"):
        study_manifest("c", {"fn": print}, metric="loss", mode="min", template=TEMPLATE)
    with pytest.raises(ValueError, match=r"resources_per_trial\['memory'\]"):
        study_manifest(
            "c", {"x": 1}, metric="loss", mode="min", template=TEMPLATE, resources={"memory": 1}
        )


def test_template_from_a_yaml_path_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(TEMPLATE))
    assert template_dict(str(path))["metadata"]["name"] == "tpl"
    with pytest.raises(TypeError, match=r"TuneConfig\.template"):
        template_dict(42)


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
    from torchjob.rules.trial import nested_config

    flat = {"train_loop_config/lr": 0.1, "train_loop_config/opt/beta": 0.9, "seed": 3}
    assert nested_config(flat) == {
        "train_loop_config": {"lr": 0.1, "opt": {"beta": 0.9}},
        "seed": 3,
    }
    assert nested_config({}) == {}


def test_a_template_naming_a_runtime_blueprint_is_kept_as_written(tmp_path: Path) -> None:
    path = REPO_ROOT / "examples" / "blueprint" / "job.yaml"
    study = study_manifest("bp", {"lr": 0.1}, metric="loss", mode="min", template=str(path))
    spec = study["spec"]["trialTemplate"]["spec"]
    assert spec["runtimeRef"] == {"name": "cpu-gloo"} and "nprocPerNode" not in spec
