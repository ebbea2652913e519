"""Runtime blueprints: the merge (torchjob.api.merge), its precedence and its errors, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.api.merge import MergeError, merge_spec, resolve
from torchjob.api.runtimes import ClusterTorchRuntime, TorchRuntimeSpec

BP = "ClusterTorchRuntime gpu"


def _bp(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "nprocPerNode": 8,
        "membershipPolicy": "KeepSurvivors",
        "elastic": {"minReplicas": 1, "maxReplicas": 4, "scaleDownAfterSeconds": 30},
        "failurePolicy": {"maxRestarts": 5, "permanentExitCodes": [3]},
        "template": {
            "metadata": {"labels": {"team": "ml"}},
            "spec": {
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [
                    {
                        "name": "worker",
                        "image": "rt:1",
                        "env": [{"name": "A", "value": "bp"}, {"name": "B", "value": "bp"}],
                        "resources": {"limits": {"nvidia.com/gpu": 8, "cpu": "8"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
            },
        },
    }
    body.update(extra)
    return body


def _job(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "runtimeRef": {"name": "gpu"},
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "worker", "command": ["python", "t.py"]}]}},
    }
    body.update(extra)
    return body


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(spec["template"]["spec"]["containers"][0])


# (case, blueprint, job, dotted path in the merged spec, expected value)
PRECEDENCE = [
    ("job scalar wins", _bp(), _job(nprocPerNode=2), "nprocPerNode", 2),
    ("blueprint fills an unset scalar", _bp(), _job(), "nprocPerNode", 8),
    ("job-only field kept", _bp(), _job(backend="gloo"), "backend", "gloo"),
    ("runtimeRef dropped", _bp(), _job(), "runtimeRef", None),
    (
        "objects merge field by field",
        _bp(),
        _job(elastic={"minReplicas": 2, "maxReplicas": 8}),
        "elastic",
        {"minReplicas": 2, "maxReplicas": 8, "scaleDownAfterSeconds": 30},
    ),
    (
        "plain lists are replaced",
        _bp(),
        _job(failurePolicy={"permanentExitCodes": [4, 5]}),
        "failurePolicy",
        {"maxRestarts": 5, "permanentExitCodes": [4, 5]},
    ),
    (
        "labels merge",
        _bp(),
        _job(template={"metadata": {"labels": {"run": "x"}}, "spec": {"containers": []}}),
        "template.metadata.labels",
        {"team": "ml", "run": "x"},
    ),
    (
        "tolerations are replaced (no merge key in Kubernetes)",
        _bp(),
        _job(template={"spec": {"containers": [], "tolerations": []}}),
        "template.spec.tolerations",
        [],
    ),
]


@pytest.mark.parametrize(
    ("case", "bp", "job", "path", "want"), PRECEDENCE, ids=[p[0] for p in PRECEDENCE]
)
def test_precedence(case: str, bp: dict, job: dict, path: str, want: Any) -> None:
    node: Any = merge_spec(bp, job)
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    assert node == want


def test_containers_env_volumes_merge_by_name() -> None:
    job = _job()
    c = job["template"]["spec"]["containers"][0]
    c["env"] = [{"name": "B", "value": "job"}, {"name": "C", "value": "job"}]
    c["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    c["resources"] = {"limits": {"cpu": "4"}}
    job["template"]["spec"]["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    job["template"]["spec"]["containers"].append({"name": "sidecar", "image": "s:1"})
    merged = merge_spec(_bp(), job)
    worker, sidecar = merged["template"]["spec"]["containers"]
    assert worker["image"] == "rt:1" and worker["command"] == ["python", "t.py"]
    assert worker["env"] == [
        {"name": "A", "value": "bp"},
        {"name": "B", "value": "job"},
        {"name": "C", "value": "job"},
    ]
    assert [m["mountPath"] for m in worker["volumeMounts"]] == ["/data", "/scratch"]
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": 8, "cpu": "4"}}
    assert sidecar == {"name": "sidecar", "image": "s:1"}
    # a volume of the same name: merged (both sources kept, the API server refuses two)
    assert merged["template"]["spec"]["volumes"][0]["name"] == "data"
    assert len(merged["template"]["spec"]["volumes"]) == 2


def test_inputs_are_not_changed() -> None:
    bp, job = _bp(), _job()
    before = repr((bp, job))
    merged = merge_spec(bp, job)
    merged["template"]["spec"]["containers"][0]["env"].append({"name": "Z"})
    assert repr((bp, job)) == before


def test_job_without_template_takes_the_blueprints() -> None:
    job = _job()
    del job["template"]
    bp = _bp()
    bp["template"]["spec"]["containers"][0]["command"] = ["python", "/app/train.py"]
    spec = resolve(bp, job, source=BP)
    assert spec.resolved_nproc_per_node() == 8 and spec.gpus_per_pod() == 8
    assert spec.runtime_ref is None and spec.replicas == 2


def test_a_resolved_spec_is_a_full_torchjob_spec() -> None:
    spec = resolve(_bp(), _job(), source=BP)
    assert spec.elastic is not None and spec.elastic.scale_down_after_seconds == 30
    assert spec.failure_policy.max_restarts == 5
    assert spec.membership_policy.value == "KeepSurvivors"
    assert _worker(spec.to_wire())["image"] == "rt:1"


# (case, blueprint, job, field named, side named, words of the message)
ERRORS = [
    (
        "job container named unlike the blueprint's",
        _bp(),
        _job(template={"spec": {"containers": [{"name": "trainer", "command": ["x"]}]}}),
        "spec.template.spec.containers[1].image",
        "the job",
        "gpu's containers: worker",
    ),
    (
        "blueprint without image",
        _bp(template={"spec": {"containers": [{"name": "worker"}]}}),
        _job(),
        "spec.template.spec.containers[0].image",
        f"the job over {BP}",
        "container image is required",
    ),
    (
        "job replicas outside the blueprint's elastic bounds",
        _bp(),
        _job(replicas=9),
        "spec",
        f"the job over {BP}",
        "spec.replicas must lie between",
    ),
    (
        "job's nprocPerNode out of bounds",
        _bp(),
        _job(replicas=1, elastic={"minReplicas": 1, "maxReplicas": 1}, nprocPerNode=0),
        "spec.nprocPerNode",
        "the job over " + BP,
        "greater than or equal to 1",
    ),
    (
        "job's retryable code that the blueprint says is permanent",
        _bp(),
        _job(failurePolicy={"retryableExitCodes": [3]}),
        "spec.failurePolicy",
        f"the job over {BP}",
        "exit codes [3] cannot be both retryable and permanent",
    ),
    (
        "blueprint's invalid field",
        _bp(backend="mpi"),
        _job(),
        "spec.backend",
        BP,
        "'auto', 'nccl' or 'gloo'",
    ),
    (
        "a job mount of a volume neither side has",
        _bp(),
        _job(
            template={
                "spec": {
                    "containers": [
                        {"name": "worker", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}
                    ]
                }
            }
        ),
        "spec",
        f"the job over {BP}",
        "must name a volume",
    ),
    (
        "no template on either side",
        {"nprocPerNode": 2},
        {"runtimeRef": {"name": "gpu"}, "replicas": 1},
        "spec.template",
        f"neither the job nor {BP}",
        "Field required",
    ),
    (
        "reserved label from the blueprint",
        _bp(
            template={
                "metadata": {"labels": {"torchjob.io/role": "x"}},
                "spec": {"containers": [{"name": "worker", "image": "i"}]},
            }
        ),
        _job(),
        "spec.template.metadata.labels",
        BP,
        "must not set torchjob.io/job-name",
    ),
]


@pytest.mark.parametrize(
    ("case", "bp", "job", "field", "side", "words"), ERRORS, ids=[e[0] for e in ERRORS]
)
def test_errors_name_the_field_and_the_side(
    case: str, bp: dict, job: dict, field: str, side: str, words: str
) -> None:
    with pytest.raises(MergeError) as err:
        resolve(bp, job, source=BP)
    assert (err.value.field, err.value.side) == (field, side), str(err.value)
    assert words in err.value.message, str(err.value)
    assert str(err.value).startswith(f"{field}: ") and f"(from {side})" in str(err.value)


def test_blueprint_model_reuses_the_torchjob_types() -> None:
    rt = ClusterTorchRuntime.model_validate({"metadata": {"name": "gpu"}, "spec": _bp()})
    assert rt.spec.elastic is not None and rt.spec.elastic.max_replicas == 4
    assert TorchRuntimeSpec.model_validate({}).to_wire() == {}
    with pytest.raises(ValueError, match="minReplicas must not exceed"):
        TorchRuntimeSpec.model_validate({"elastic": {"minReplicas": 3, "maxReplicas": 2}})


def test_committed_blueprint_crds_are_generated_and_do_not_collide_with_kubeflow() -> None:
    from pathlib import Path

    import yaml
    from tests.unit.test_api import _kube_openapi

    from torchjob.api.runtime_crd import FILES, render_runtime_crd_yaml

    _kube_openapi()
    repo = Path(__file__).resolve().parents[2]
    kubeflow = {"trainingruntime", "clustertrainingruntime", "trainingruntimes"}
    kubeflow |= {"clustertrainingruntimes", "TrainingRuntime", "ClusterTrainingRuntime"}
    for file, cluster in FILES.items():
        text = render_runtime_crd_yaml(cluster)
        assert (repo / "crds" / file).read_text() == text, "crds/ is stale: run `make crds`"
        spec = yaml.safe_load(text)["spec"]
        assert spec["scope"] == ("Cluster" if cluster else "Namespaced")
        names = spec["names"]
        used = {names["kind"], names["plural"], names["singular"], *names["shortNames"]}
        assert not used & kubeflow
        columns = [c["name"] for c in spec["versions"][0]["additionalPrinterColumns"]]
        assert columns[:5] == ["Image", "GPUs", "Procs", "Min", "Max"]
