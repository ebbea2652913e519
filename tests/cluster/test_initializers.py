"""``spec.initializers`` against the real API server: the initialiser pods come first and no
worker pod exists before every one of them succeeded; a failed one fails the job with its
message in the status, a condition and a Warning Event; a new generation never runs them
again. kwok plays the kubelet: the tests make the initialiser pods exit the way other
cluster tests drive workers, with the termination message ``torchjob initialize`` leaves.
The initialiser really fetching, in a container, is tests/cluster/test_real_node.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob
from tests.cluster.volumes import bound_claim

from torchjob import contract
from torchjob.rules import initializer as rules

pytestmark = pytest.mark.cluster

DATA, MODEL = "s3://datasets/digits/train", "s3://models/tiny"


@pytest.fixture
def claim(core_v1: Any, namespace: str) -> Iterator[str]:
    """A bound PersistentVolumeClaim (kwok's nodes mount nothing)."""
    pv = bound_claim(core_v1, namespace, "train-data", f"/tmp/{namespace}")
    try:
        yield "train-data"
    finally:
        core_v1.delete_persistent_volume(pv)


def _job(name: str, claim: str) -> dict[str, Any]:
    return torchjob(
        name,
        initializers={
            "volume": {"claimName": claim},
            "dataset": {"uri": DATA, "secretName": "store"},
            "model": {"uri": MODEL},
        },
    )


def _kinds(jobs: Jobs, name: str) -> dict[str, Any]:
    """This job's pods by role: initializer pods by kind, workers by name."""
    out: dict[str, Any] = {}
    for p in jobs.pods(name):
        labels = p.metadata.labels or {}
        out[labels.get(rules.LABEL_KIND) or p.metadata.name] = p
    return out


def _initializers(jobs: Jobs, name: str, *phases: str) -> Any:
    """Wait until status.initializers shows ``phases`` (dataset, model)."""

    def shown(status: dict[str, Any]) -> Any:
        found = [i.get("phase") for i in status.get("initializers") or []]
        return status if found == list(phases) else None

    return jobs.wait(name, shown, f"status.initializers {phases}")


def _workers(jobs: Jobs, name: str, generation: int) -> list[Any]:
    """The job's 2 worker pods, Running in ``generation`` (its Completed initialiser pods, which
    ``Jobs.wait_running_pods`` would count, left out)."""

    def running() -> list[Any] | None:
        pods = [
            p
            for p in jobs.pods(name)
            if p.metadata.labels.get(contract.LABEL_ROLE) == contract.ROLE_WORKER
            and p.metadata.deletion_timestamp is None
        ]
        ok = len(pods) == 2 and all(
            p.status.phase == "Running"
            and p.metadata.labels.get(contract.LABEL_GENERATION) == str(generation)
            for p in pods
        )
        return pods if ok else None

    return k.wait_for(  # type: ignore[no-any-return]
        running, 90, lambda: f"2 Running workers of generation {generation}\n{jobs.describe(name)}"
    )


def _exit(jobs: Jobs, name: str, kind: str, code: int, line: str) -> None:
    pod = rules.pod_name(name, kind)
    k.wait_for_pod_phase(jobs.core, jobs.ns, pod, "Running")
    jobs.exit_pod(pod, code, message=contract.termination_message(line))


def test_no_worker_before_the_initializers_and_none_again_in_a_new_generation(
    jobs: Jobs, claim: str
) -> None:
    jobs.apply(_job("init", claim))
    _initializers(jobs, "init", "Running", "Running")
    pods = _kinds(jobs, "init")
    assert sorted(pods) == ["dataset", "model"], sorted(pods)
    c = pods["dataset"].spec.containers[0]
    assert c.command[:2] == ["torchjob", "initialize"] and c.env_from[0].secret_ref.name == "store"
    status = jobs.status("init")
    assert status["phase"] == "Pending"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Initializing"

    _exit(jobs, "init", "dataset", 0, rules.summary(1 << 20, 3, DATA))
    _initializers(jobs, "init", "Succeeded", "Running")
    assert sorted(_kinds(jobs, "init")) == ["dataset", "model"]  # still no worker

    _exit(jobs, "init", "model", 0, rules.summary(4096, 1, MODEL))
    workers = _workers(jobs, "init", 0)
    env = {e.name: e.value for e in workers[0].spec.containers[0].env}
    assert env[contract.DATASET_PATH] == "/torchjob/initializers/dataset"
    assert env[contract.MODEL_PATH] == "/torchjob/initializers/model"
    mounts = {m.mount_path: m.read_only for m in workers[0].spec.containers[0].volume_mounts}
    assert mounts["/torchjob/initializers"] is True
    # The operator creates the workers before it writes the status that made them (a crash in
    # between is harmless): the pods can run before the status shows the model's outcome.
    status = _initializers(jobs, "init", "Succeeded", "Succeeded")
    recorded = {i["name"]: i for i in status["initializers"]}
    assert recorded["dataset"]["bytes"] == 1 << 20 and recorded["model"]["bytes"] == 4096
    events = jobs.wait_events("init", "CreatedInitializer", "InitializerSucceeded", "PodsCreated")
    assert sum(e.reason == "InitializerSucceeded" for e in events) == 2

    # A worker fails: generation 1 starts, and with the initialisers' pods gone, none returns.
    for kind in ("dataset", "model"):
        jobs.core.delete_namespaced_pod(rules.pod_name("init", kind), jobs.ns)
    jobs.exit_pod("init-worker-1", 1)
    _workers(jobs, "init", 1)
    jobs.wait("init", lambda s: s.get("restarts") == 1 or None, "status.restarts 1")
    assert not any(p.metadata.labels.get(rules.LABEL_KIND) for p in jobs.pods("init"))
    assert [i["phase"] for i in jobs.status("init")["initializers"]] == ["Succeeded"] * 2


def test_a_failed_initializer_fails_the_job_with_its_error_and_no_worker(
    jobs: Jobs, claim: str
) -> None:
    jobs.apply(_job("bad", claim))
    bad = (
        f"cannot read {DATA}: access to bucket 'datasets' denied with the credentials in use "
        "(Forbidden); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    )
    _exit(jobs, "bad", "dataset", 1, bad)
    status = jobs.wait_phase("bad", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InitializerFailed"
    assert DATA in failed["message"] and "bucket 'datasets'" in failed["message"]
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"
    dataset = status["initializers"][0]
    assert dataset["phase"] == "Failed" and dataset["message"] == bad
    warning = next(e for e in jobs.wait_events("bad", "InitializerFailed") if e.type == "Warning")
    assert "bucket 'datasets'" in warning.message
    assert not any("-worker-" in p.metadata.name for p in jobs.pods("bad"))
    with pytest.raises(client.ApiException):  # and the job never made one
        jobs.core.read_namespaced_pod("bad-worker-0", jobs.ns)
