"""Runtime blueprints (TorchRuntime, ClusterTorchRuntime) against the real API server and the
operator: the example's 10-line job, a missing blueprint, a blueprint edited and deleted
under a running job, an invalid merge, a TorchTune trial template with a blueprint, and the
blueprints' ``kubectl get`` columns."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.cluster.operator_harness import REPO, Jobs, worker_template

from torchjob import contract
from torchjob.api.models import GROUP, VERSION
from torchjob.api.torchtune import PLURAL as TUNE_PLURAL

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "blueprint"


def blueprint(name: str, *, cluster: bool = False, **spec: Any) -> dict[str, Any]:
    template = worker_template()
    template["spec"]["containers"][0]["env"] = [{"name": "FROM", "value": "blueprint"}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterTorchRuntime" if cluster else "TorchRuntime",
        "metadata": {"name": name},
        "spec": {
            "nprocPerNode": 2,
            "failurePolicy": {"maxRestarts": 3, "backoff": {"initialSeconds": 1, "maxSeconds": 2}},
            "template": template,
            **spec,
        },
    }


def job(name: str, runtime: str, **spec: Any) -> dict[str, Any]:
    """A data scientist's job: the blueprint, a size and a command."""
    body = {
        "runtimeRef": {"name": runtime, "kind": "TorchRuntime"},
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "trainer", "command": ["train"]}]}},
        **spec,
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchJob",
        "metadata": {"name": name},
        "spec": body,
    }


def _reason(jobs: Jobs, name: str, reason: str) -> dict[str, Any]:
    def ready(status: dict[str, Any]) -> dict[str, Any] | None:
        found = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
        return found[0] if found and found[0]["reason"] == reason else None

    return jobs.wait(name, ready, f"Ready reason {reason}")  # type: ignore[no-any-return]


def columns(out: str) -> dict[str, str]:
    """The first row of ``kubectl get``'s table, by column (empty cells included)."""
    header, row = out.splitlines()[:2]
    names, starts = header.split(), []
    for n in names:  # in order: "AGE" is also inside "IMAGE"
        starts.append(header.index(n, starts[-1] + 1 if starts else 0))
    ends = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def _stalled(jobs: Jobs, name: str) -> str:
    conds = {c["type"]: c for c in jobs.status(name).get("conditions") or []}
    return str(conds["Stalled"]["status"])


def test_the_example_job_of_ten_lines_gets_the_blueprints_pods(jobs: Jobs) -> None:
    text = (EXAMPLE / "job.yaml").read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) <= 10, "a data scientist's TorchJob with a blueprint is 10 lines or fewer"
    jobs.cluster.kubectl("apply", "-f", str(EXAMPLE / "runtime.yaml"))
    jobs.kubectl("apply", "-f", str(EXAMPLE / "job.yaml"))
    pods = jobs.wait_running_pods("allreduce", 2, generation=0)
    worker = pods[0].spec.containers[0]
    assert worker.image == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"  # the blueprint's
    assert worker.command[:2] == ["python", "-c"]  # the job's
    env = {e.name: e.value for e in worker.env}
    assert env["OMP_NUM_THREADS"] == "1" and env[contract.BACKEND] == "gloo"
    assert worker.resources.limits == {"cpu": "1", "memory": "1Gi"}
    assert pods[0].spec.termination_grace_period_seconds == 5
    runtime = jobs.status("allreduce")["runtime"]
    assert (runtime["kind"], runtime["name"]) == ("ClusterTorchRuntime", "cpu-gloo")
    assert runtime["resourceVersion"] and runtime["spec"]["backend"] == "gloo"
    jobs.wait_events("allreduce", "RuntimeResolved")
    # kubectl get: the blueprints' columns
    row = columns(jobs.cluster.kubectl("get", "ctjrt", "cpu-gloo").stdout)
    assert list(row) == ["NAME", "IMAGE", "GPUS", "PROCS", "MIN", "MAX", "AGE"]
    assert row["IMAGE"] == worker.image and (row["GPUS"], row["PROCS"]) == ("", "1")


def test_a_missing_blueprint_is_a_condition_until_it_is_created(jobs: Jobs) -> None:
    jobs.apply(job("waits", "later"))
    ready = _reason(jobs, "waits", "RuntimeNotFound")
    assert "TorchRuntime later, which does not exist" in ready["message"]
    assert _stalled(jobs, "waits") == "False" and not jobs.pods("waits")
    jobs.wait_events("waits", "RuntimeNotFound")
    later = blueprint("later", elastic={"minReplicas": 1, "maxReplicas": 3}, nprocPerNode="gpu")
    gpu = {"limits": {"nvidia.com/gpu": 2}, "requests": {"cpu": "100m", "memory": "64Mi"}}
    later["spec"]["template"]["spec"]["containers"][0]["resources"] = gpu
    jobs.apply(later)
    pods = jobs.wait_running_pods("waits", 2, generation=0, timeout=90)
    env = {e.name: e.value for e in pods[0].spec.containers[0].env}
    assert env["FROM"] == "blueprint" and env[contract.NPROC_PER_NODE] == "2"
    jobs.wait_phase("waits", "Running")
    assert _stalled(jobs, "waits") == "False"
    row = columns(jobs.kubectl("get", "tjrt", "later").stdout)
    assert (row["GPUS"], row["PROCS"], row["MIN"], row["MAX"]) == ("2", "gpu", "1", "3")


def test_a_running_job_keeps_its_blueprint_when_it_is_edited_or_deleted(jobs: Jobs) -> None:
    jobs.apply(blueprint("pinned"))
    jobs.apply(job("keeps", "pinned"))
    jobs.wait_running_pods("keeps", 2, generation=0)
    version = jobs.status("keeps")["runtime"]["resourceVersion"]
    edited = blueprint("pinned")
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/other:2"
    jobs.apply(edited)
    jobs.kubectl("delete", "tjrt", "pinned")
    jobs.exit_pod("keeps-worker-1", 1)  # generation 1 is made after the edit and the delete
    pods = jobs.wait_running_pods("keeps", 2, generation=1)
    assert {p.spec.containers[0].image for p in pods} == {"registry.k8s.io/pause:3.10"}
    runtime = jobs.status("keeps")["runtime"]
    assert (runtime["name"], runtime["resourceVersion"]) == ("pinned", version)


def test_an_invalid_merge_names_the_field_and_the_side(jobs: Jobs) -> None:
    jobs.apply(blueprint("bounded", elastic={"minReplicas": 1, "maxReplicas": 2}))
    bad = job("toobig", "bounded", replicas=3)
    bad["spec"]["template"]["spec"]["containers"].append({"name": "sidecar"})
    jobs.apply(bad)
    ready = _reason(jobs, "toobig", "InvalidRuntimeMerge")
    assert "spec.template.spec.containers[1].image: container image is required" in ready["message"]
    assert (
        "(from the job)" in ready["message"]
        and "TorchRuntime bounded's containers: trainer" in ready["message"]
    )
    assert _stalled(jobs, "toobig") == "True"
    jobs.wait_events("toobig", "InvalidRuntimeMerge")
    fixed = job("toobig", "bounded", replicas=3)
    jobs.kubectl("replace", "-f", "-", input=yaml.safe_dump(fixed))
    ready = jobs.wait(
        "toobig",
        lambda s: next(
            (c for c in s.get("conditions") or [] if "replicas must lie" in c["message"]), None
        ),
        "the next error: replicas out of the blueprint's bounds",
    )
    assert "(from the job over TorchRuntime bounded)" in ready["message"]


def test_a_torchtune_trial_template_with_a_blueprint(jobs: Jobs) -> None:
    jobs.apply(blueprint("trials"))
    trial = copy.deepcopy(job("x", "trials", replicas=1)["spec"])
    study = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchTune",
        "metadata": {"name": "bp-study"},
        "spec": {
            "searchSpace": [{"name": "lr", "type": "categorical", "values": [0.1]}],
            "objective": {"metric": "loss", "mode": "min"},
            "maxTrials": 1,
            "trialTemplate": {"spec": trial},
        },
    }
    jobs.apply(study)
    (pod,) = jobs.wait_running_pods("bp-study-t0", 1, generation=0, timeout=90)
    worker = pod.spec.containers[0]
    env = {e.name: e.value for e in worker.env}
    assert worker.image == "registry.k8s.io/pause:3.10" and worker.command == ["train"]
    assert env["FROM"] == "blueprint" and '"lr": 0.1' in env[contract.TUNE_CONFIG]
    tune = jobs.custom.get_namespaced_custom_object(
        GROUP, VERSION, jobs.ns, TUNE_PLURAL, "bp-study"
    )
    assert tune["spec"]["trialTemplate"]["spec"]["runtimeRef"]["name"] == "trials"
    assert jobs.status("bp-study-t0")["runtime"]["name"] == "trials"


def test_cli_submit_and_sdk_create_with_a_runtime(jobs: Jobs, tmp_path: Path) -> None:
    from tests.cluster.test_client import cli, ok, write_manifest

    from torchjob.client import ManifestError, TorchJobClient

    jobs.apply(blueprint("shared"))
    doc = job("from-cli", "shared")
    del doc["spec"]["runtimeRef"]  # --runtime names it
    path = write_manifest(tmp_path, doc)
    # (a missing blueprint's message: tests/unit/test_runtime_client.py; one CLI start here)
    ok(cli(jobs, "submit", "-f", str(path), "--runtime", "TorchRuntime/shared"))
    sdk = TorchJobClient(kubeconfig=jobs.cluster.kubeconfig, namespace=jobs.ns)
    try:
        doc["metadata"]["name"] = "from-sdk"
        sdk.create(doc, runtime="TorchRuntime/shared")
        doc["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
        with pytest.raises(ManifestError, match=r"containers\[1\]\.image: .*\(from the job\)"):
            sdk.create({**doc, "metadata": {"name": "wrong"}}, runtime="TorchRuntime/shared")
    finally:
        sdk.api_client.close()
    for name in ("from-cli", "from-sdk"):
        pods = jobs.wait_running_pods(name, 2, generation=0)
        worker = pods[0].spec.containers[0]
        assert (worker.image, worker.command) == ("registry.k8s.io/pause:3.10", ["train"])
    assert jobs.get("wrong") is None
