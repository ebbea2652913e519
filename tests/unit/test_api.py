"""The API models and the CRD generated from them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from torchjob.api import TorchJob, TorchJobSpec, kube_schema
from torchjob.api.crd import build_crd as _build_crd
from torchjob.api.crd import render_crd_yaml as _render_crd_yaml
from torchjob.api.models import JOB_NAME

REPO = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
# What Kubernetes (and controller-gen) write for an int-or-string: allowed in a structural schema.
INT_OR_STRING = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}


def _kube_openapi() -> None:
    """The CRD embeds Kubernetes' pod template schema: without its OpenAPI document the CRD
    cannot be built. CI builds the testbin first (which downloads it), so there it is a failure."""
    try:
        kube_schema.openapi_path()
    except kube_schema.KubeOpenAPIMissing as missing:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(str(missing))


def build_crd() -> dict:
    _kube_openapi()
    return _build_crd()


def render_crd_yaml() -> str:
    _kube_openapi()
    return _render_crd_yaml()


def spec(**extra: object) -> dict:
    body: dict = {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
    }
    body.update(extra)
    return body


def test_committed_crd_is_generated_from_the_models() -> None:
    committed = (REPO / "crds" / "torchjob.io_torchjobs.yaml").read_text()
    assert committed == render_crd_yaml(), "crds/ is stale: run `make crds`"
    chart = (
        REPO / "charts" / "torchjob-operator" / "crds" / "torchjob.io_torchjobs.yaml"
    ).read_text()
    assert chart == committed


def _walk(node: object, path: str = "") -> list[str]:
    """Paths of schema nodes that are not structural (no type and no int-or-string/preserve)."""
    bad = []
    if isinstance(node, dict):
        if ("properties" in node or "items" in node) and "type" not in node:
            bad.append(path)
        for key in ("anyOf", "oneOf", "$ref", "const", "title"):
            if key in node and not (key == "anyOf" and node == INT_OR_STRING | node):
                bad.append(f"{path}.{key}")
        for name, sub in (node.get("properties") or {}).items():
            bad += _walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            bad += _walk(node["items"], f"{path}[]")
    return bad


def test_crd_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []
    nproc = schema["properties"]["spec"]["properties"]["nprocPerNode"]
    assert nproc["x-kubernetes-int-or-string"] is True


def test_crd_has_scale_status_and_printer_columns() -> None:
    version = build_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == [
        "Phase",
        "Ready",
        "Gen",
        "Restarts",
        "Disruptions",
        "Epoch",
        "Managed-By",
        "Age",
    ]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        pytest.param(
            {"replicas": 9, "elastic": {"minReplicas": 1, "maxReplicas": 4}},
            "between spec.elastic.minReplicas",
            id="out-of-bounds",
        ),
        pytest.param({"nprocPerNode": "many"}, "nprocPerNode", id="bad-nproc"),
        pytest.param({"backend": "mpi"}, "backend", id="bad-backend"),
        pytest.param({"managedBy": "multikueue"}, "managedBy", id="managed-by-no-domain"),
        pytest.param({"managedBy": "a.io/" + "x" * 60}, "managedBy", id="managed-by-too-long"),
        pytest.param({"replicas": 0}, "replicas", id="zero"),
        pytest.param({"failurePolicy": {"maxRestart": 3}}, "maxRestart", id="typo-is-an-error"),
        pytest.param({"checkpoint": {}}, "spec.checkpoint needs a path", id="empty-checkpoint"),
        # The same rules the CRD's CEL enforces, so `torchjob run -f` rejects what the cluster would.
        pytest.param({"checkpoint": {"path": ""}}, "checkpoint.path", id="empty-checkpoint-path"),
        pytest.param(
            {"checkpoint": {"pvc": {"claimName": "My_PVC"}}}, "claimName must be", id="bad-claim"
        ),
        pytest.param({"nprocPerNode": 4294967296}, "nprocPerNode", id="huge-nproc"),
        pytest.param(
            {"failurePolicy": {"retryableExitCodes": [0]}}, "retryableExitCodes", id="exit-0"
        ),
        pytest.param(
            {"failurePolicy": {"backoff": {"initialSeconds": 600}}},
            "initialSeconds must not exceed maxSeconds",
            id="backoff-order",
        ),
        pytest.param(
            {"scheduling": {"queueName": "team a"}}, "queueName must be a valid label", id="queue"
        ),
        pytest.param(
            {
                "nprocPerNode": "gpu",
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "t", "image": "i", "resources": {"limits": {GPU: "500m"}}}
                        ]
                    }
                },
            },
            "whole number of GPUs",
            id="gpu-500m",
        ),
        pytest.param(
            {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "t",
                                "image": "i",
                                "resources": {"limits": {GPU: 4}, "requests": {GPU: 2}},
                            }
                        ]
                    }
                }
            },
            "must be equal when both are given",
            id="gpu-requests-limits",
        ),
        pytest.param(
            {
                "template": {
                    "spec": {"restartPolicy": "Always", "containers": [{"name": "t", "image": "i"}]}
                }
            },
            "restartPolicy must be Never",
            id="restart-policy",
        ),
    ],
)
def test_invalid_specs_name_the_field(extra: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        TorchJobSpec.model_validate(spec(**extra))
    assert fragment in str(err.value)


def test_examples_parse_and_resolve_processes_per_pod() -> None:
    gpu = TorchJob.model_validate(
        yaml.safe_load((REPO / "examples" / "multi-gpu.yaml").read_text())
    )
    assert gpu.spec.resolved_nproc_per_node() == 8
    cpu = TorchJob.model_validate(
        yaml.safe_load((REPO / "examples" / "cpu-smoke.yaml").read_text())
    )
    assert cpu.spec.resolved_nproc_per_node() == 1


def test_import_api_and_contract_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, torchjob.api, torchjob.contract, torchjob.rules, torchjob_operator.torchjob.plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param(("scheduling", "schedulerName"), "my scheduler", id="scheduler-with-space"),
        pytest.param(("runPolicy", "activeDeadlineSeconds"), 2**63 - 1, id="deadline-int64"),
        pytest.param(("runPolicy", "ttlSecondsAfterFinished"), 2**31 - 1, id="ttl-int32"),
    ],
)
def test_no_rule_stricter_than_kubernetes(field: tuple[str, str], value: object) -> None:
    """What a Pod or Job accepts, a TorchJob accepts (issue 17); the CRD says the same."""
    TorchJobSpec.model_validate(spec(**{field[0]: {field[1]: value}}))
    props = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    node = props["spec"]["properties"][field[0]]["properties"][field[1]]
    assert "x-kubernetes-validations" not in node and "pattern" not in node
    if isinstance(value, int):
        assert node.get("maximum", 2**63 - 1) >= value


def test_envfrom_ports_pull_secrets_have_no_count_bound_and_env_the_cel_one() -> None:
    """No CEL rule iterates envFrom, ports or imagePullSecrets: no bound, as Pods. env's bound
    is the largest the env-name rule's cost allows (docs/api.md, Bounds)."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pod = schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    container = pod["properties"]["containers"]["items"]
    for key in ("envFrom", "ports"):
        assert "maxItems" not in container["properties"][key], key
    assert "maxItems" not in pod["properties"]["imagePullSecrets"]
    assert container["properties"]["env"]["maxItems"] == 1024


@pytest.mark.parametrize("name", ["3d-unet", "a", "tj-0"])
def test_job_name_rule_is_the_service_name_rule(name: str) -> None:
    assert re.match(JOB_NAME, name)
    assert not re.match(JOB_NAME, name + "-") and not re.match(JOB_NAME, "a.b")
