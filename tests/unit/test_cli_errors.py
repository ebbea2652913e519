"""Bad manifests and missing credentials give messages that name the file, the field or the fix."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchjob.cli.main import EXIT_API_ERROR, EXIT_USAGE, main


def job(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "w", "command": ["python", "-c", "pass"]}]}},
    }
    base.update(spec)
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": {"name": "j"},
        "spec": base,
    }


def without(doc: dict[str, Any], *path: str) -> dict[str, Any]:
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return doc


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        pytest.param(job(replicas=0), "spec.replicas", id="zero-replicas"),
        pytest.param(job(replicas="two"), "spec.replicas", id="string-replicas"),
        pytest.param(job(nprocPerNode="tpu"), "spec.nprocPerNode", id="bad-nproc"),
        pytest.param(job(backend="mpi"), "spec.backend", id="bad-backend"),
        pytest.param(
            job(elastic={"minReplicas": 3, "maxReplicas": 2}),
            "spec.elastic",
            id="max-below-min",
        ),
        pytest.param(
            job(template={"spec": {"containers": []}}),
            "spec.template.spec.containers",
            id="no-containers",
        ),
        pytest.param(without(job(), "spec", "template"), "spec.template", id="no-template"),
        pytest.param(without(job(), "metadata", "name"), "metadata.name", id="no-name"),
        pytest.param({**job(), "kind": "PyTorchJob"}, "kind", id="wrong-kind"),
        pytest.param({**job(), "apiVersion": "kubeflow.org/v1"}, "apiVersion", id="wrong-group"),
    ],
)
def test_bad_manifest_names_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any], field: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", "-f", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {field}"), err


def test_missing_file_and_invalid_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["run", "-f", str(missing)]) == EXIT_USAGE
    assert f"{missing}: <file>: no such file" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    assert main(["submit", "-f", str(broken)]) == EXIT_USAGE
    assert "is not valid YAML" in capsys.readouterr().err


def test_no_kubeconfig_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["get"]) == EXIT_API_ERROR
    err = capsys.readouterr().err
    assert "no Kubernetes credentials found" in err and "KUBECONFIG" in err


def test_without_the_kubernetes_package_the_cli_names_the_extra_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pip install torchjob` alone brings no kubernetes client: the cluster commands say
    what to install instead of a ModuleNotFoundError traceback."""
    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    assert main(["get"]) == EXIT_API_ERROR
    err = capsys.readouterr().err
    assert "kubernetes package" in err and "pip install 'torchjob[client]'" in err, err
    assert "Traceback" not in err


def test_explicit_kubeconfig_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "kc.yaml"
    assert main(["logs", "somejob", "--kubeconfig", str(missing)]) == EXIT_API_ERROR
    assert f"kubeconfig {missing}: no such file" in capsys.readouterr().err


def test_unknown_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kc = tmp_path / "kc.yaml"
    kc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team"}}
                ],
                "current-context": "ctx",
            }
        )
    )
    assert main(["delete", "j", "--kubeconfig", str(kc), "--context", "other"]) == EXIT_API_ERROR
    assert "other" in capsys.readouterr().err


def test_context_namespace_is_the_default(tmp_path: Path) -> None:
    from torchjob.client import TorchJobClient

    kc = tmp_path / "kc.yaml"
    kc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team"}}
                ],
                "current-context": "ctx",
            }
        )
    )
    assert TorchJobClient(kubeconfig=kc).namespace == "team"
    assert TorchJobClient(kubeconfig=kc, namespace="mine").namespace == "mine"
