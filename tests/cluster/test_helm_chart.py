"""The Helm chart: lints, renders, and every object it renders is accepted by the real API server."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import REPO

pytestmark = pytest.mark.cluster

CHART = REPO / "charts" / "torchjob-operator"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(k.helm_path()), *args], capture_output=True, text=True, timeout=k.scaled(120)
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}{proc.stdout}"
    return proc


DIGEST = "sha256:" + "0" * 64
HARDENED = [
    "--set",
    "replicaCount=2",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
    "--set",
    f"image.digest={DIGEST}",
]
"""Every optional part on: what hack/lint-chart.sh lints with checkov."""


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="defaults"),
        pytest.param(
            [
                *("--set", "watchNamespaces={team-a,team-b}", "--set", "metrics.enabled=false"),
                *("--set", "workerPolicy.enabled=false"),
            ],
            id="namespaced-no-metrics-no-worker-policy",
        ),
        pytest.param(["--set", "replicaCount=2"], id="ha-two-replicas"),
        pytest.param(HARDENED, id="hardened"),
    ],
)
def test_chart_renders_objects_the_api_server_accepts(
    cluster: k.Cluster, crd: None, namespace: str, values: list[str]
) -> None:
    helm("lint", str(CHART), *values)
    rendered = helm(
        "template", "torchjob", str(CHART), "--namespace", namespace, "--include-crds", *values
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole"} <= kinds
    # the pre-built runtime blueprints (values.yaml runtimes), and the operator may read them
    runtimes = {
        d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ClusterTorchRuntime"
    }
    assert set(runtimes) == {"torch-cpu", "torch-gpu", "torch-gpu8"}
    assert runtimes["torch-gpu8"]["nprocPerNode"] == 8
    gpus = {n: r["template"]["spec"]["containers"][0]["resources"] for n, r in runtimes.items()}
    assert gpus["torch-gpu"]["limits"]["nvidia.com/gpu"] == 1
    assert gpus["torch-gpu8"]["limits"]["nvidia.com/gpu"] == 8
    assert "nvidia.com/gpu" not in str(gpus["torch-cpu"])
    # The worker admission policy (on by default) and its Deny binding: the server-side dry
    # run below compiles its CEL (tests/cluster/test_worker_policy.py tests what it does).
    admission = {d["kind"]: d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")}
    if "workerPolicy.enabled=false" in values:
        assert admission == {}
    else:
        binding = admission["ValidatingAdmissionPolicyBinding"]
        assert binding["spec"]["policyName"] == "torchjob-operator-worker-writes"
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert admission["ValidatingAdmissionPolicy"]["metadata"]["labels"]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    reads = next(r for r in role["rules"] if "clustertorchruntimes" in r["resources"])
    assert {"torchruntimes", "clustertorchruntimes"} <= set(reads["resources"])
    assert {"get", "list", "watch"} <= set(reads["verbs"])
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if any(v.startswith("watchNamespaces") for v in values):
        assert "--namespace=team-a" in args and "--namespace=team-b" in args
        assert not any(a.startswith("--metrics-port") for a in args)
    else:
        assert "--metrics-port=8080" in args
    # Leader election is on by default, with a Role for the Lease: replicaCount 2 is safe.
    assert "--leader-elect" in args
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    role = roles["torchjob-operator-leader-election"]
    assert role["rules"][0]["resources"] == ["leases"]
    # The nodes' Leases are read, in kube-node-lease only (engine/nodewatch.py LeaseWatch).
    leases = roles["torchjob-operator-node-leases"]
    assert leases["metadata"]["namespace"] == "kube-node-lease"
    assert leases["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]}
    ]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if "replicaCount=2" in values:  # one replica stays up through a drain
        assert len(pdbs) == 1 and pdbs[0]["spec"]["minAvailable"] == 1
        assert pdbs[0]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    else:  # a single replica: no PDB, so a drain is never blocked
        assert pdbs == []
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if values is HARDENED:
        assert container["image"] == f"ghcr.io/torchjob/operator@{DIGEST}"
        (policy,) = policies
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        ingress_ports = {port["port"] for rule in spec["ingress"] for port in rule["ports"]}
        assert ingress_ports == {"healthz", "metrics"}
        api, dns = spec["egress"]
        assert {p["port"] for p in api["ports"]} == {443, 6443}
        assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
        assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
        assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    else:
        assert policies == []
        assert ":" in container["image"].rsplit("/", 1)[-1] and "@" not in container["image"]
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "file",
    [
        "torchjob.io_torchjobs.yaml",
        "torchjob.io_torchruntimes.yaml",
        "torchjob.io_clustertorchruntimes.yaml",
    ],
)
def test_chart_crd_is_the_generated_one(file: str) -> None:
    assert (CHART / "crds" / file).read_text() == (REPO / "crds" / file).read_text()


def test_pre_built_runtimes_can_be_turned_off() -> None:
    off = [f"--set=runtimes.{k}.enabled=false" for k in ("cpu", "gpu8")]
    rendered = helm("template", "torchjob", str(CHART), *off).stdout
    names = [
        d["metadata"]["name"]
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ClusterTorchRuntime"
    ]
    assert names == ["torch-gpu"]


def test_the_pdb_lets_a_drain_take_one_of_two_operator_replicas(
    cluster: k.Cluster, kube: Any, namespace: str
) -> None:
    """The chart's PodDisruptionBudget, computed by the real disruption controller over the
    chart's own Deployment (two replicas on kwok nodes): one replica may go, not two."""
    rendered = helm(
        "template",
        "torchjob",
        str(CHART),
        "--namespace",
        namespace,
        *HARDENED,
        "--set",
        "nodeSelector.type=kwok",
        "--set",
        "tolerations[0].operator=Exists",
    ).stdout
    wanted = {"ServiceAccount", "Deployment", "PodDisruptionBudget"}  # namespaced, no RBAC
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in wanted]
    assert {d["kind"] for d in docs} == wanted
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    policy = client.PolicyV1Api(kube)

    def computed() -> Any:
        st = policy.read_namespaced_pod_disruption_budget(pdb["metadata"]["name"], namespace).status
        ok = st is not None and st.current_healthy == 2 and st.expected_pods == 2
        return st if ok else None

    status = k.wait_for(
        computed,
        90,
        "the disruption controller to count both operator replicas",
        core=client.CoreV1Api(kube),
        namespace=namespace,
    )
    assert (status.desired_healthy, status.disruptions_allowed) == (1, 1)
