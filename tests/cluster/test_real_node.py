"""The operator and the runtime in real containers: a real node, a real `helm install`.

hack/node.sh joins a real kubelet + containerd node to the test cluster; the operator image
(hack/images.sh) is installed with charts/torchjob-operator and runs on that node under the
chart's ServiceAccount, ClusterRole and security context; the workers run the CPU runtime
image (Debian's torch) and find each other through the headless Service's DNS names (CoreDNS).
The training script is tests/e2e/train_job.py, mounted read-only from this checkout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob
from tests.cluster.real_jobs import (
    OPERATOR_NS,
    logs,
    pod_logs,
    real_template,
    wait_finished,
)
from tests.cluster.realnode import (
    NODE_LABEL,
    TOLERATION,
    HelmOperator,
    RealNode,
    s3_credentials,
)
from tests.e2e.train_job import TORN_EPOCH, TORN_INDEX
from tests.s3 import S3, S3Server

from torchjob import contract
from torchjob.checkpoint import MANIFEST, MARKER, CheckpointStorage

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.realnode]


def test_operator_runs_in_its_pod_under_the_charts_security_context(
    helm_operator: HelmOperator, real_node: RealNode, kube: Any
) -> None:
    pod = helm_operator.wait_ready()
    # On a real node (real containers); which of them is the scheduler's choice.
    assert pod.spec.node_name in real_node.names, (pod.spec.node_name, real_node.names)
    assert pod.spec.service_account_name == "torchjob-operator"
    sc = pod.spec.containers[0].security_context
    assert sc.read_only_root_filesystem and not sc.allow_privilege_escalation
    assert sc.capabilities.drop == ["ALL"]
    assert pod.spec.security_context.run_as_non_root
    status = pod.status.container_statuses[0]
    assert status.ready and status.restart_count == 0, helm_operator.logs()
    # Leader election (the chart's Role on leases): the pod's hostname holds the Lease.
    leases = client.CoordinationV1Api(kube)

    def holder() -> str | None:
        lease = leases.read_namespaced_lease("torchjob-operator", OPERATOR_NS)
        who = lease.spec.holder_identity or ""
        return who if who.startswith(f"{pod.metadata.name}_") else None

    k.wait_for(
        holder,
        60,
        lambda: f"the operator pod to hold its Lease\n{helm_operator.logs()}",
        interval=0.5,
        ignore=(client.ApiException,),
    )


def test_two_pods_of_two_processes_train_with_gloo_through_the_headless_service_dns(
    real_jobs: Jobs, storage: Path
) -> None:
    real_jobs.apply(
        torchjob(
            "ddp",
            replicas=2,
            nprocPerNode=2,
            backend="gloo",
            template=real_template(storage, "4", "-1"),
            checkpoint={"path": str(storage)},
            failurePolicy={"maxRestarts": 0},
        )
    )
    status = wait_finished(real_jobs, "ddp")
    out = {i: logs(real_jobs, f"ddp-worker-{i}") for i in (0, 1)}
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('ddp')}\n{out}"
    master = contract.worker_hostname("ddp", 0, real_jobs.ns)
    # Every rank joined through the DNS name of pod 0 (the only address the pods were given).
    for i, ranks in ((0, (0, 1)), (1, (2, 3))):
        for rank in ranks:
            assert re.search(
                rf"rank {rank} of 4 on ddp-worker-{i}\b.*group via {re.escape(master)}", out[i]
            ), out[i]
    assert "done: 4 epochs, world size 4" in out[0]
    assert CheckpointStorage(str(storage)).list_committed(), "rank 0 committed checkpoints"
    assert (status.get("progress") or {}).get("epoch") == 3, status
    # ... written by rank 0's agent with its kubelet-mounted token, through the worker admission
    # policy that the chart installs by default (tests/cluster/test_worker_policy.py).
    admission = client.AdmissionregistrationV1Api(real_jobs.custom.api_client)
    policies = admission.list_validating_admission_policy()
    assert "torchjob-operator-worker-writes" in {p.metadata.name for p in policies.items}


def test_a_worker_that_raises_puts_its_error_in_describe(real_jobs: Jobs, storage: Path) -> None:
    real_jobs.apply(
        torchjob(
            "boom",
            replicas=2,
            backend="gloo",
            template=real_template(storage, "6", "2", env={"TORCHJOB_E2E_CRASH": "raise"}),
            checkpoint={"path": str(storage)},
            failurePolicy={"maxRestarts": 0},
        )
    )
    status = wait_finished(real_jobs, "boom")
    assert status["phase"] == "Failed", real_jobs.describe("boom")
    assert status["lastFailure"]["pod"] == "boom-worker-1", real_jobs.describe("boom")
    described = real_jobs.kubectl("describe", "tj", "boom").stdout
    assert "RuntimeError" in described and "rank 1 raised at epoch 2" in described, described


def test_keep_survivors_keeps_the_surviving_pod_and_the_replacement_joins(
    real_jobs: Jobs, storage: Path
) -> None:
    real_jobs.apply(
        torchjob(
            "keep",
            replicas=2,
            backend="gloo",
            membershipPolicy="KeepSurvivors",
            template=real_template(storage, "8", "3", "0.2"),
            checkpoint={"path": str(storage)},
            failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 1}},
        )
    )
    survivor = real_jobs.wait_running_pods("keep", 2, generation=0, timeout=180)[0]
    container = survivor.status.container_statuses[0].container_id
    status = wait_finished(real_jobs, "keep")
    out0 = logs(real_jobs, "keep-worker-0")
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('keep')}\n{out0}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (1, 0, 1)
    pod0 = real_jobs.core.read_namespaced_pod("keep-worker-0", real_jobs.ns)
    assert pod0.metadata.uid == survivor.metadata.uid, "pod 0 was kept, not recreated"
    assert pod0.status.container_statuses[0].container_id == container, "same container"
    assert pod0.status.container_statuses[0].restart_count == 0
    assert "this pod stays and waits for generation 1" in out0, out0
    assert re.search(r"resumed from epoch [23] at generation 1", out0), out0
    assert "done: 8 epochs, world size 2" in out0


def s3_template(
    storage: Path, env_from: dict[str, Any], *args: str, **kwargs: Any
) -> dict[str, Any]:
    """``real_template`` without its checkpoint volume (``storage`` is not mounted): the
    object store is the one place the pods share, its identity from a Secret (``envFrom``)."""
    template = real_template(storage, *args, **kwargs)
    container = template["spec"]["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] == "scripts"]
    template["spec"]["volumes"] = [v for v in template["spec"]["volumes"] if v["name"] == "scripts"]
    container["envFrom"] = [env_from]
    container["env"].append({"name": "HOME", "value": "/tmp"})
    return template


def test_keep_survivors_loses_rank_0_mid_upload_and_resumes_on_another_pod_from_s3(
    real_jobs: Jobs, storage: Path, node_s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints at s3://BUCKET/run on SeaweedFS (tests/s3.py), reached by the pods at the
    host's address, credentials from a Secret. Rank 0 (pod 0) commits epochs 0 to 3, then dies
    in the middle of saving checkpoint 900 (files and manifest uploaded, no commit marker): it
    is evicted while it waits there. The other pod survives, generation 1 resumes from epoch
    3's committed checkpoint read from the bucket, never from the torn 900, and goes on
    committing past it."""
    bucket = node_s3.make_bucket()
    s3 = S3(node_s3, bucket, monkeypatch)
    s3.use(node_s3.env())
    creds = s3_credentials(real_jobs.core, real_jobs.ns, node_s3)
    epochs, torn_at = 8, 3
    real_jobs.apply(
        torchjob(
            "s3keep",
            replicas=2,
            backend="gloo",
            membershipPolicy="KeepSurvivors",
            template=s3_template(
                storage,
                creds,
                str(epochs),
                "-1",
                "0.2",
                grace=3,
                env={"TORCHJOB_E2E_TORN_AT": str(torn_at)},
            ),
            checkpoint={"path": s3.url("run")},
            failurePolicy={"maxRestarts": 0},
        )
    )
    pods = real_jobs.wait_running_pods("s3keep", 2, generation=0, timeout=240)
    lost = next(p for p in pods if p.metadata.name == "s3keep-worker-0")
    fs = node_s3.fs()
    torn = f"{bucket}/run/checkpoint_{TORN_INDEX:06d}"

    reader = CheckpointStorage(s3.url("run"))

    def torn_uploaded() -> bool:
        # Both: epoch 3's checkpoint commits in the background while the torn save uploads.
        fs.invalidate_cache()
        committed = [c.metrics.get("epoch") for c in reader.list_committed()]
        return torn_at in committed and fs.exists(f"{torn}/{MANIFEST}")

    k.wait_for(
        torn_uploaded,
        300,
        lambda: f"epoch {torn_at} committed, {torn} uploaded\n{pod_logs(real_jobs, 's3keep')}",
        interval=1.0,
    )
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="s3keep-worker-0"))
    real_jobs.core.create_namespaced_pod_eviction("s3keep-worker-0", real_jobs.ns, eviction)

    status = wait_finished(real_jobs, "s3keep")
    out = {p.metadata.name: logs(real_jobs, p.metadata.name) for p in real_jobs.pods("s3keep")}
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('s3keep')}\n{out}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (0, 1, 1)
    # Generation 1's rank 0 (status.members[0]; pods in index order when absent) is another
    # pod than the rank 0 lost: a new pod 0, or the survivor.
    lead = f"s3keep-worker-{(status.get('members') or [0])[0]}"
    pod = real_jobs.core.read_namespaced_pod(lead, real_jobs.ns)
    assert pod.metadata.uid != lost.metadata.uid, "rank 0 resumed on another pod"
    assert f"resumed from epoch {torn_at} at generation 1" in out[lead], out[lead]
    assert f"done: {epochs} epochs, world size 2" in out[lead], out[lead]

    # The bucket, read from the test: the torn save is there without its marker, and what
    # generation 1 loaded is the latest committed checkpoint below it.
    fs.invalidate_cache()
    left = fs.find(torn)
    assert f"{torn}/{MANIFEST}" in left and f"{torn}/{MARKER}" not in left, left
    assert torch_load(fs.cat_file(f"{torn}/state.pt"))["epoch"] == TORN_EPOCH
    committed = reader.list_committed()
    before = [c for c in committed if c.index < TORN_INDEX]
    after = [c for c in committed if c.index > TORN_INDEX]
    assert TORN_INDEX not in [c.index for c in committed], committed
    assert before[-1].metrics["epoch"] == torn_at, before
    assert (
        torch_load(fs.cat_file(f"{bucket}/run/{Path(before[-1].path).name}/state.pt"))["epoch"]
        == torn_at
    )
    assert [c.metrics["epoch"] for c in after] == list(range(torn_at + 1, epochs)), after
    reported = (status.get("progress") or {}).get("lastCheckpoint") or ""
    assert reported.startswith(s3.url("run", "checkpoint_")), status


def test_bad_s3_credentials_fail_the_job_at_start_naming_the_bucket(
    real_jobs: Jobs, storage: Path, node_s3: S3Server
) -> None:
    """A Secret with a wrong secret key: rank 0's pod fails before training, and the user
    reads why (the bucket named, the credentials to check) in the job's status, its
    WorkerFailed Event and ``kubectl describe tj``."""
    bucket = node_s3.make_bucket()
    creds = s3_credentials(
        real_jobs.core, real_jobs.ns, node_s3, AWS_SECRET_ACCESS_KEY="not-the-secret"
    )
    real_jobs.apply(
        torchjob(
            "s3bad",
            replicas=1,
            backend="gloo",
            template=s3_template(storage, creds, "4", "-1"),
            checkpoint={"path": f"s3://{bucket}/run"},
            failurePolicy={"maxRestarts": 0},
        )
    )
    status = wait_finished(real_jobs, "s3bad", timeout=300)
    assert status["phase"] == "Failed", real_jobs.describe("s3bad")
    said = f"access to bucket '{bucket}' denied"
    failure = status["lastFailure"]
    assert failure["pod"] == "s3bad-worker-0" and said in failure["message"], failure
    assert "AWS_SECRET_ACCESS_KEY" in failure["message"], failure
    k.wait_for(
        lambda: any(said in (e.message or "") for e in real_jobs.events("s3bad")),
        30,
        lambda: f"an Event saying {said!r}\n{real_jobs.describe('s3bad')}",
        interval=0.5,
    )
    described = real_jobs.kubectl("describe", "tj", "s3bad").stdout
    assert said in described, described
    assert "rank 0 of" not in logs(real_jobs, "s3bad-worker-0"), "no worker started"


def torch_load(data: bytes) -> Any:
    import io

    import torch

    return torch.load(io.BytesIO(data))


def test_helm_upgrade_rolls_the_operator_and_uninstall_keeps_the_crd(
    helm_operator: HelmOperator, cluster: k.Cluster, tmp_path: Path
) -> None:
    before = helm_operator.wait_ready()
    # Every switch on (issue 41): the Prometheus Operator's CRDs (ServiceMonitor,
    # PrometheusRule; from the module proxy, hack/build-testbin.sh monitoring-crds) first; the
    # dashboard runs on the real node, and --wait holds until its readiness probe, a GET of
    # /api/jobs through its read-only ServiceAccount, answers.
    crds = k.testbin_root() / f"monitoring-crds-{k.read_versions()['PROMETHEUS_OPERATOR_VERSION']}"
    assert crds.is_dir(), f"{crds} missing: run `make testbin`"
    cluster.kubectl("apply", "--server-side", "-f", str(crds))
    cluster.wait_established(
        "servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"
    )
    switches = [
        "dashboard.enabled=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
        "networkPolicy.enabled=true",
    ]
    helm_operator.install(
        tmp_path / "values.yaml",
        "--set",
        "createConcurrency=8",
        *(arg for switch in switches for arg in ("--set", switch)),
        command="upgrade",
    )
    after = helm_operator.wait_ready()
    assert after.metadata.uid != before.metadata.uid, "the upgrade replaced the operator pod"
    assert "--create-concurrency=8" in after.spec.containers[0].args
    dashboard = helm_operator.core.list_namespaced_pod(
        OPERATOR_NS, label_selector="app.kubernetes.io/name=torchjob-operator-dashboard"
    ).items
    assert dashboard and k.pod_condition(dashboard[0], "Ready").status == "True", dashboard
    assert dashboard[0].spec.node_selector == {NODE_LABEL: "true"}, "on the real node"
    for kind in ("servicemonitor", "prometheusrule", "networkpolicy"):
        out = cluster.kubectl("get", kind, "-n", OPERATOR_NS, "-o", "name").stdout
        assert "torchjob-operator" in out, (kind, out)
    dashboards = cluster.kubectl(
        "get", "configmap", "-n", OPERATOR_NS, "-l", "grafana_dashboard=1", "-o", "name"
    )
    assert "torchjob-operator-dashboard" in dashboards.stdout, dashboards.stdout
    helm_operator.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait")
    k.wait_for(lambda: not helm_operator.pods(), 60, "the operator pod to go")
    # Helm never deletes a chart's crds/: TorchJobs (and their data) survive an uninstall.
    crd = cluster.kubectl("get", "crd", "torchjobs.torchjob.io", check=False)
    assert crd.returncode == 0, crd.stderr
    # Reinstall for any test that runs after this one in the module.
    helm_operator.install(tmp_path / "values2.yaml")


# --- spec.initializers: fetched once, in a container, from the object store ------------------

READ_DATASET = """
import hashlib, os, pathlib
root = pathlib.Path(os.environ["TORCHJOB_DATASET_PATH"])
for f in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
    print(f"{os.environ['TORCHJOB_POD_NAME']} read {f.relative_to(root)} "
          f"sha256 {hashlib.sha256(f.read_bytes()).hexdigest()}", flush=True)
"""


def test_an_initializer_fetches_from_the_object_store_once_and_both_workers_read_it(
    real_jobs: Jobs, node_s3: Any, tmp_path: Path
) -> None:
    import hashlib

    from tests.cluster.realnode import s3_credentials
    from tests.cluster.volumes import bound_claim

    from torchjob.rules import initializer as rules

    bucket = node_s3.make_bucket()
    files = {"train/a.bin": os.urandom(3 << 20), "train/b.bin": os.urandom(1000)}
    for key, data in files.items():
        node_s3.fs().pipe(f"{bucket}/{key}", data)
    secret = s3_credentials(real_jobs.core, real_jobs.ns, node_s3)["secretRef"]["name"]
    volume = tmp_path / "volume"
    volume.mkdir()
    volume.chmod(0o777)  # the runtime image runs as uid 1000
    pv = bound_claim(real_jobs.core, real_jobs.ns, "train-data", volume)
    uri = f"s3://{bucket}/train"
    try:
        template = real_template(volume)  # the node, the image; the command below
        container = template["spec"]["containers"][0]
        container["command"] = ["python3", "-c", READ_DATASET]
        container["volumeMounts"] = container["volumeMounts"][:1]
        template["spec"]["volumes"] = template["spec"]["volumes"][:1]
        real_jobs.apply(
            torchjob(
                "init",
                replicas=2,
                template=template,
                failurePolicy={"maxRestarts": 0},
                initializers={
                    "volume": {"claimName": "train-data"},
                    "dataset": {"uri": uri, "secretName": secret},
                    "nodeSelector": {NODE_LABEL: "true"},
                    "tolerations": [TOLERATION],
                },
            )
        )
        status = wait_finished(real_jobs, "init", timeout=300)
        assert status["phase"] == "Succeeded", real_jobs.describe("init")
        (init,) = status["initializers"]
        assert init["phase"] == "Succeeded" and init["bytes"] == sum(map(len, files.values()))
        assert init["message"].startswith(f"fetched {init['bytes']} bytes in 2 files from {uri}")
        for i in (0, 1):
            out = logs(real_jobs, f"init-worker-{i}")
            for key, data in files.items():
                name = key.split("/", 1)[1]
                digest = hashlib.sha256(data).hexdigest()
                assert f"init-worker-{i} read {name} sha256 {digest}" in out, out
        assert (volume / "dataset" / rules.MARKER).is_file()
        assert "InitializerSucceeded" in real_jobs.event_reasons("init")
    finally:
        real_jobs.kubectl("delete", "tj/init", "--wait=true", check=False)
        real_jobs.core.delete_persistent_volume(pv)
