"""The Helm chart: lints, renders, and every object it renders is accepted by the real API server."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from tests import kube as k
from tests.cluster.operator_harness import REPO

pytestmark = pytest.mark.cluster

CHART = REPO / "charts" / "torchjob-operator"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(k.helm_path()), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}{proc.stdout}"
    return proc


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="defaults"),
        pytest.param(
            ["--set", "watchNamespaces={team-a,team-b}", "--set", "metrics.enabled=false"],
            id="namespaced-no-metrics",
        ),
        pytest.param(["--set", "replicaCount=2"], id="ha-two-replicas"),
    ],
)
def test_chart_renders_objects_the_api_server_accepts(
    cluster: k.Cluster, namespace: str, values: list[str]
) -> None:
    helm("lint", str(CHART), *values)
    rendered = helm(
        "template", "torchjob", str(CHART), "--namespace", namespace, "--include-crds", *values
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole"} <= kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if any(v.startswith("watchNamespaces") for v in values):
        assert "--namespace=team-a" in args and "--namespace=team-b" in args
        assert not any(a.startswith("--metrics-port") for a in args)
    else:
        assert "--metrics-port=8080" in args
    # Leader election is on by default, with a Role for the Lease: replicaCount 2 is safe.
    assert "--leader-elect" in args
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["rules"][0]["resources"] == ["leases"]
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert out.returncode == 0, out.stderr


def test_chart_crd_is_the_generated_one() -> None:
    assert (CHART / "crds" / "torchjob.io_torchjobs.yaml").read_text() == (
        REPO / "crds" / "torchjob.io_torchjobs.yaml"
    ).read_text()
