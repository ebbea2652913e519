"""The SDK's and the CLI's side of runtime blueprints: naming one, and a manifest checked
merged over the blueprint a resolver reads (errors name the file, the field and the side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchjob.api.models import RuntimeKind, RuntimeRef
from torchjob.client.manifest import ManifestError, check_manifest, load_manifests
from torchjob.client.runtimes import parse_runtime, with_runtime

REPO = Path(__file__).resolve().parents[2]
BLUEPRINT = {
    "metadata": {"name": "cpu-gloo"},
    "spec": {
        "nprocPerNode": 3,
        "template": {"spec": {"containers": [{"name": "trainer", "image": "rt:1"}]}},
    },
}


@pytest.mark.parametrize(
    ("value", "kind", "name"),
    [
        ("torch-gpu", RuntimeKind.CLUSTER_TORCH_RUNTIME, "torch-gpu"),
        ("TorchRuntime/team", RuntimeKind.TORCH_RUNTIME, "team"),
        ("tjrt/team", RuntimeKind.TORCH_RUNTIME, "team"),
        ("ClusterTorchRuntime/x", RuntimeKind.CLUSTER_TORCH_RUNTIME, "x"),
    ],
)
def test_parse_runtime(value: str, kind: RuntimeKind, name: str) -> None:
    assert parse_runtime(value) == RuntimeRef(name=name, kind=kind)


def test_parse_runtime_refuses_other_kinds_and_names() -> None:
    with pytest.raises(ValueError, match="ClusterTorchRuntime or TorchRuntime"):
        parse_runtime("TrainingRuntime/x")
    with pytest.raises(ValueError, match="name"):
        parse_runtime("Bad_Name")


def _resolver(found: dict[str, Any] | None) -> Any:
    asked: list[tuple[RuntimeRef, str | None]] = []

    def resolve(ref: RuntimeRef, ns: str | None) -> dict[str, Any] | None:
        asked.append((ref, ns))
        return found

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


def test_the_example_job_is_checked_merged_over_its_blueprint() -> None:
    resolver = _resolver(BLUEPRINT)
    (m,) = load_manifests(REPO / "examples" / "blueprint" / "job.yaml", resolver)
    assert m.job.spec.resolved_nproc_per_node() == 3  # the blueprint's
    assert m.container().argv[:2] == ["python", "-c"]  # the job's
    assert "nprocPerNode" not in m.raw["spec"]  # what is sent is what was written
    assert resolver.asked[0][0].name == "cpu-gloo"


def test_with_runtime_sets_the_ref_without_touching_the_input() -> None:
    doc = {"metadata": {"name": "j"}, "spec": {"replicas": 1}}
    out = with_runtime(doc, "TorchRuntime/team")
    assert out["spec"]["runtimeRef"] == {"name": "team", "kind": "TorchRuntime"}
    assert "runtimeRef" not in doc["spec"] and with_runtime(doc, None) == doc


def _job(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j"},
        "spec": {"runtimeRef": {"name": "cpu-gloo"}, "replicas": 1, **spec},
    }


@pytest.mark.parametrize(
    ("doc", "found", "field", "words"),
    [
        (_job(), None, "spec.runtimeRef", "ClusterTorchRuntime cpu-gloo does not exist"),
        (
            _job(runtimeRef={"name": "x", "kind": "Other"}),
            BLUEPRINT,
            "spec.runtimeRef.kind",
            "Input should be",
        ),
        (
            _job(template={"spec": {"containers": [{"name": "main", "command": ["t"]}]}}),
            BLUEPRINT,
            "spec.template.spec.containers[1].image",
            "(from the job)",
        ),
        (
            _job(nprocPerNode=0),
            BLUEPRINT,
            "spec.nprocPerNode",
            "(from the job over ClusterTorchRuntime cpu-gloo)",
        ),
    ],
)
def test_errors_name_the_file_field_and_side(doc: dict, found: Any, field: str, words: str) -> None:
    with pytest.raises(ManifestError) as err:
        check_manifest(doc, "job.yaml", _resolver(found))
    assert err.value.field == field and words in str(err.value)
    assert str(err.value).startswith(f"job.yaml: {field}: ")


def test_without_a_cluster_a_blueprint_job_says_what_it_needs() -> None:
    with pytest.raises(ManifestError, match="needs the cluster that holds it"):
        check_manifest(_job(), "job.yaml")
