"""The operator against the real control plane, driven the way users drive it.

kube-apiserver validates (OpenAPI + CEL), kube-scheduler places and preempts,
kube-controller-manager garbage-collects; kwok plays the kubelets and, through
the project's Stages, makes containers exit with chosen codes.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import (
    REPO,
    Jobs,
    torchjob,
    worker_template,
)

from torchjob import contract

pytestmark = pytest.mark.cluster


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


# --- creation --------------------------------------------------------------------------


def test_apply_example_creates_workers_service_and_reports_running(jobs: Jobs) -> None:
    manifest = yaml.safe_load((REPO / "examples" / "cpu-smoke.yaml").read_text())
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 0
    jobs.apply(manifest)
    pods = jobs.wait_running_pods("cpu-smoke", 2, generation=0)
    jobs.cluster.kubectl(
        "-n",
        jobs.ns,
        "wait",
        "--for=condition=Running",
        "tj/cpu-smoke",
        f"--timeout={k.scaled(60):.0f}s",
    )

    # Condition Running says every worker runs; a pod's Ready can land in a later status
    # write than its phase (the last CI read READY 1/2 here once).
    jobs.wait("cpu-smoke", lambda s: s if s.get("workers") == "2/2" else None, "status.workers 2/2")
    job = jobs.get("cpu-smoke")
    assert job is not None
    assert [p.metadata.name for p in pods] == ["cpu-smoke-worker-0", "cpu-smoke-worker-1"]
    for i, p in enumerate(pods):
        assert p.spec.hostname == f"cpu-smoke-worker-{i}"
        assert p.spec.subdomain == "cpu-smoke"
        assert p.spec.restart_policy == "Never"
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "TorchJob",
            "cpu-smoke",
            job["metadata"]["uid"],
            True,
        )
        env = env_of(p)
        assert env[contract.RANK] == str(i)
        assert env[contract.WORLD_SIZE] == "2"
        assert env[contract.MASTER_ADDR] == f"cpu-smoke-worker-0.cpu-smoke.{jobs.ns}.svc"
        assert env[contract.PET_NNODES] == "2"
        assert env[contract.BACKEND] == "gloo"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert any(v.empty_dir and v.empty_dir.medium == "Memory" for v in p.spec.volumes)

    svc = jobs.core.read_namespaced_service("cpu-smoke", jobs.ns)
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.publish_not_ready_addresses is True

    table = jobs.kubectl("get", "tj", "cpu-smoke").stdout
    header, row = table.strip().splitlines()
    assert header.split()[:6] == ["NAME", "PHASE", "READY", "GEN", "RESTARTS", "AGE"]
    assert row.split()[:5] == ["cpu-smoke", "Running", "2/2", "0", "0"]

    jobs.wait_events("cpu-smoke", "CreatedPod", "AllWorkersRunning")
    described = jobs.kubectl("describe", "tj", "cpu-smoke").stdout
    assert "AllWorkersRunning" in described and "Conditions" in described


def test_multi_gpu_job_lands_on_gpu_nodes_with_world_size_of_all_processes(jobs: Jobs) -> None:
    manifest = torchjob(
        "gpus",
        replicas=2,
        nprocPerNode="gpu",
        template=worker_template(),
    )
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 4}
    }
    jobs.apply(manifest)
    pods = jobs.wait_running_pods("gpus", 2, generation=0)
    gpu_nodes = set(jobs.cluster.gpu_nodes(jobs.core))
    for p in pods:
        assert p.spec.node_name in gpu_nodes
        res = p.spec.containers[0].resources
        assert res.requests["nvidia.com/gpu"] == res.limits["nvidia.com/gpu"] == "4"
        env = env_of(p)
        assert env[contract.WORLD_SIZE] == "8"  # 2 pods x 4 GPUs, not 2
        assert env[contract.NPROC_PER_NODE] == "4"
    # The operator creates the pods before it writes the status: the pods can run before the
    # job's first status write lands.
    status = jobs.wait("gpus", lambda s: s if "worldSize" in s else None, "status.worldSize")
    assert status["worldSize"] == 8


def test_creation_is_concurrent_and_complete_for_a_large_job(jobs: Jobs) -> None:
    jobs.apply(torchjob("big", replicas=24))
    pods = jobs.wait_running_pods("big", 24, generation=0, timeout=120)
    assert sorted(int(p.metadata.labels[contract.LABEL_POD_INDEX]) for p in pods) == list(range(24))


# --- outcomes ----------------------------------------------------------------------------


def test_all_workers_exit_zero_succeeds(jobs: Jobs) -> None:
    jobs.apply(torchjob("ok", replicas=2))
    pods = jobs.wait_running_pods("ok", 2, generation=0)
    for p in pods:
        jobs.exit_pod(p.metadata.name, 0)
    jobs.cluster.kubectl(
        "-n",
        jobs.ns,
        "wait",
        "--for=condition=Succeeded",
        "tj/ok",
        f"--timeout={k.scaled(60):.0f}s",
    )
    status = jobs.status("ok")
    assert status["phase"] == "Succeeded" and status["completionTime"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"  # kstatus: a finished job is healthy for GitOps
    # cleanPodPolicy Running keeps the finished pods for their logs
    assert len(jobs.pods("ok")) == 2


def test_failure_restarts_group_then_succeeds(jobs: Jobs) -> None:
    jobs.apply(torchjob("flaky", replicas=2))
    pods = jobs.wait_running_pods("flaky", 2, generation=0)
    old_uids = {p.metadata.uid for p in pods}
    jobs.exit_pod("flaky-worker-1", 1)
    jobs.wait(
        "flaky",
        lambda s: s.get("restarts") == 1 and s.get("phase") in ("Restarting", "Running"),
        "restart 1",
    )
    pods = jobs.wait_running_pods("flaky", 2, generation=1)
    assert not old_uids & {p.metadata.uid for p in pods}, "the whole group is restarted"
    status = jobs.wait_phase("flaky", "Running")
    assert status["lastFailure"]["pod"] == "flaky-worker-1"
    assert status["lastFailure"]["exitCode"] == 1
    assert status["disruptions"] == 0
    jobs.wait_events("flaky", "WorkerFailed")
    for p in pods:
        jobs.exit_pod(p.metadata.name, 0)
    jobs.wait_phase("flaky", "Succeeded")


def test_the_pod_that_raised_is_blamed_not_the_peer_whose_collective_broke(jobs: Jobs) -> None:
    jobs.apply(torchjob("blame", replicas=3))
    jobs.wait_running_pods("blame", 3, generation=0)
    # What the runtime writes: pod 0 only lost its peer; pod 2 raised, and exits 3 s later.
    peer = contract.termination_message(
        "rank 0 raised DistBackendError: Connection closed by peer", peer_failure=True
    )
    own = contract.termination_message("rank 2 raised ValueError: bad batch", "Traceback ...")
    jobs.exit_pod("blame-worker-0", 1, message=peer)
    jobs.exit_pod("blame-worker-2", 1, after="3s", message=own)
    status = jobs.wait(
        "blame", lambda s: s if s.get("restarts") == 1 else None, "restart 1", timeout=60
    )
    assert status["lastFailure"]["pod"] == "blame-worker-2", jobs.describe("blame")
    assert status["lastFailure"]["message"] == "rank 2 raised ValueError: bad batch"
    failed = [e for e in jobs.wait_events("blame", "WorkerFailed") if e.reason == "WorkerFailed"]
    assert "blame-worker-2 exited with code 1 (Error): rank 2 raised ValueError" in (
        failed[0].message
    )
    described = jobs.kubectl("describe", "tj", "blame").stdout
    assert "rank 2 raised ValueError: bad batch" in described


def test_keep_survivors_replaces_only_the_pod_that_failed(jobs: Jobs) -> None:
    jobs.apply(torchjob("keeper", replicas=3, membershipPolicy="KeepSurvivors"))
    before = {p.metadata.name: p.metadata.uid for p in jobs.wait_running_pods("keeper", 3, 0)}
    jobs.exit_pod("keeper-worker-1", 1)
    # The survivors are relabelled into generation 1; only worker 1 is a new pod.
    pods = jobs.wait_running_pods("keeper", 3, generation=1)
    after = {p.metadata.name: p.metadata.uid for p in pods}
    assert after["keeper-worker-0"] == before["keeper-worker-0"]
    assert after["keeper-worker-2"] == before["keeper-worker-2"]
    assert after["keeper-worker-1"] != before["keeper-worker-1"]
    replacement = env_of(next(p for p in pods if p.metadata.name == "keeper-worker-1"))
    assert replacement[contract.GENERATION] == "1"
    assert replacement[contract.MEMBERSHIP] == contract.KEEP_SURVIVORS
    status = jobs.wait_phase("keeper", "Running")
    assert (status["restarts"], status["disruptions"]) == (1, 0)
    assert status["lastFailure"]["pod"] == "keeper-worker-1"
    # Both Events of that reconcile, waited for together: the operator posts DeletedPod just
    # after KeptSurvivors, so reading once when KeptSurvivors shows could miss it.
    events = jobs.wait_events("keeper", "KeptSurvivors", "DeletedPod")
    kept = [e for e in events if e.reason == "KeptSurvivors"]
    assert "keeper-worker-0, keeper-worker-2" in kept[0].message
    deleted = [e.message for e in events if e.reason == "DeletedPod"]
    assert deleted == ["deleted pod keeper-worker-1"], deleted
    out = jobs.kubectl(
        "patch",
        "tj/keeper",
        "--type=merge",
        "-p",
        '{"spec":{"membershipPolicy":"RecreateGroup"}}',
        check=False,
    )
    assert out.returncode != 0 and "spec.membershipPolicy is immutable" in out.stderr


def test_permanent_exit_code_fails_at_once(jobs: Jobs) -> None:
    jobs.apply(
        torchjob(
            "bad-config", replicas=2, failurePolicy={"maxRestarts": 5, "permanentExitCodes": [3]}
        )
    )
    jobs.wait_running_pods("bad-config", 2, generation=0)
    jobs.exit_pod("bad-config-worker-0", 3)
    status = jobs.wait_phase("bad-config", "Failed")
    assert status["restarts"] == 0
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PermanentFailure"
    assert "exited with code 3" in failed["message"]
    jobs.cluster.kubectl(
        "-n",
        jobs.ns,
        "wait",
        "--for=condition=Stalled",
        "tj/bad-config",
        f"--timeout={k.scaled(30):.0f}s",
    )
    # cleanPodPolicy Running: the surviving worker is deleted, the failed one kept for its logs
    k.wait_for(
        lambda: (
            [
                p.metadata.name
                for p in jobs.pods("bad-config")
                if p.metadata.deletion_timestamp is None
            ]
            == ["bad-config-worker-0"]
        ),
        30,
        "only the failed pod remains",
    )


def test_restart_budget_exhausted_fails(jobs: Jobs) -> None:
    jobs.apply(
        torchjob(
            "doomed", replicas=1, failurePolicy={"maxRestarts": 1, "backoff": {"initialSeconds": 0}}
        )
    )
    jobs.wait_running_pods("doomed", 1, generation=0)
    jobs.exit_pod("doomed-worker-0", 1)
    jobs.wait_running_pods("doomed", 1, generation=1)
    jobs.exit_pod("doomed-worker-0", 1)
    status = jobs.wait_phase("doomed", "Failed")
    assert status["restarts"] == 1
    jobs.wait_events("doomed", "RestartLimitExceeded")


# --- disruptions -------------------------------------------------------------------------


def test_preemption_by_the_real_scheduler_is_a_disruption(jobs: Jobs, cluster: k.Cluster) -> None:
    for name, value in (("tj-test-low", 10), ("tj-test-high", 1000)):
        # Returns once the Priority admission plugin (an informer) resolves the class: the
        # operator's pod creates would otherwise be refused with 403 for a moment.
        k.create_priority_class(
            jobs.core.api_client, name, value, preemptionPolicy="PreemptLowerPriority"
        )
    node = cluster.gpu_nodes(jobs.core)[-1]
    gpus = int(jobs.core.read_node(node).status.allocatable["nvidia.com/gpu"])
    # A grace period, as real trainers have: the preempted pod lingers with DisruptionTarget=True.
    pinned = {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 3}
    manifest = torchjob(
        "spot",
        replicas=2,
        template=worker_template(**pinned),
        scheduling={"priorityClassName": "tj-test-low"},
        failurePolicy={"maxRestarts": 0},
    )
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": gpus // 2}
    }
    jobs.apply(manifest)
    jobs.wait_running_pods("spot", 2, generation=0)

    intruder = k.pod_manifest(
        "intruder",
        gpus=gpus // 2,
        priority_class="tj-test-high",
        node_selector={"kubernetes.io/hostname": node},
    )
    jobs.core.create_namespaced_pod(jobs.ns, intruder)
    status = jobs.wait(
        "spot",
        lambda s: s if s.get("disruptions", 0) >= 1 else None,
        "a disruption counted",
        timeout=90,
    )
    assert status["restarts"] == 0, "a preemption must never consume maxRestarts (which is 0 here)"
    assert status["phase"] in ("Restarting", "Pending", "Starting")
    disrupted = [
        e for e in jobs.wait_events("spot", "WorkerDisrupted") if e.reason == "WorkerDisrupted"
    ]
    assert disrupted and "Preemption" in disrupted[0].message
    # The job waits for capacity instead of failing: its new generation is Pending.
    jobs.wait(
        "spot",
        lambda s: s.get("currentGeneration", 0) >= 1 and s.get("phase") != "Failed",
        "new generation",
    )
    jobs.core.delete_namespaced_pod("intruder", jobs.ns, grace_period_seconds=0)
    jobs.wait_running_pods(
        "spot", 2, generation=jobs.status("spot")["currentGeneration"], timeout=90
    )
    assert jobs.status("spot")["restarts"] == 0


def test_pod_deleted_by_a_user_is_a_disruption(jobs: Jobs) -> None:
    jobs.apply(torchjob("victim", replicas=2, failurePolicy={"maxRestarts": 0}))
    jobs.wait_running_pods("victim", 2, generation=0)
    jobs.kubectl("delete", "pod", "victim-worker-0", "--wait=false")
    jobs.wait_running_pods("victim", 2, generation=1)
    status = jobs.wait_phase("victim", "Running")
    assert (status["disruptions"], status["restarts"]) == (1, 0)


HOLD = k.HOLD


def test_a_job_recreated_under_the_same_name_waits_for_the_old_pods(jobs: Jobs) -> None:
    """issue 19: `kubectl delete tj x --wait` then `kubectl apply` of x at once. The old
    job's pods and its worker ServiceAccount are held present (terminating, by a finalizer)
    while the new job is reconciled: it must neither count the pods (a spurious disruption
    threw generation 0 away) nor create pods of the same names, nor create pods that would
    run under the account about to vanish; once they go, its generation 0 starts."""
    jobs.apply(torchjob("again", replicas=2))
    old = [p.metadata.name for p in jobs.wait_running_pods("again", 2, generation=0)]
    old_uid = jobs.get("again")["metadata"]["uid"]  # type: ignore[index]
    account = contract.worker_service_account("again")
    hold = {"metadata": {"finalizers": [HOLD]}}
    release = {"metadata": {"finalizers": None}}
    for pod in old:
        jobs.core.patch_namespaced_pod(pod, jobs.ns, hold)
    jobs.core.patch_namespaced_service_account(account, jobs.ns, hold)

    def waiting_for(what: str) -> Any:
        return jobs.wait(
            "again",
            lambda s: (
                s
                if any(
                    c.get("reason") == "WaitingForEarlierJob" and what in c.get("message", "")
                    for c in s.get("conditions") or []
                )
                else None
            ),
            f"the new job waits for the earlier job's {what}",
        )

    try:
        jobs.kubectl("delete", "torchjob", "again", "--wait=true")
        # The garbage collector deletes the old pods; the finalizer keeps them terminating.
        k.wait_for(
            lambda: all(p.metadata.deletion_timestamp for p in jobs.pods("again")),
            60,
            "the old job's pods terminating",
            core=jobs.core,
            namespace=jobs.ns,
        )
        jobs.apply(torchjob("again", replicas=2))
        status = waiting_for("pods")
        new_uid = jobs.get("again")["metadata"]["uid"]  # type: ignore[index]
        assert new_uid != old_uid
        assert (status["currentGeneration"], status["disruptions"], status["restarts"]) == (0, 0, 0)
        assert status.get("createdGeneration") is None
        owners = sorted(p.metadata.owner_references[0].uid for p in jobs.pods("again"))
        assert owners == [old_uid, old_uid]
        # The pods go; the old account is still there: still no pod.
        for pod in old:
            jobs.core.patch_namespaced_pod(pod, jobs.ns, release)
        status = waiting_for(f"ServiceAccount {account}")
        assert (status["currentGeneration"], status["disruptions"], status["restarts"]) == (0, 0, 0)
        assert jobs.pods("again") == []
    finally:
        for pod in old:
            with contextlib.suppress(client.exceptions.ApiException):
                jobs.core.patch_namespaced_pod(pod, jobs.ns, release)
        with contextlib.suppress(client.exceptions.ApiException):
            jobs.core.patch_namespaced_service_account(account, jobs.ns, release)
    # The account goes: the new job's generation 0 is created, with nothing counted.
    pods = jobs.wait_running_pods("again", 2, generation=0)
    assert {p.metadata.owner_references[0].uid for p in pods} == {new_uid}
    sa = jobs.core.read_namespaced_service_account(account, jobs.ns)
    assert sa.metadata.owner_references[0].uid == new_uid
    status = jobs.wait_phase("again", "Running")
    assert (status["currentGeneration"], status["disruptions"], status["restarts"]) == (0, 0, 0)
    # The new job's own Events: the old one's (same name, its uid) may say its pods went.
    reasons = [e.reason for e in jobs.events("again") if e.involved_object.uid == new_uid]
    assert "WorkerDisrupted" not in reasons


def evict_held(jobs: Jobs, pod: str) -> None:
    k.evict_held(jobs.core, jobs.ns, pod)


def release(jobs: Jobs, pod: str) -> None:
    k.release_held(jobs.core, jobs.ns, pod)


def test_an_elastic_job_goes_on_smaller_while_the_evicted_pod_still_terminates(
    jobs: Jobs,
) -> None:
    """issue 16: the Eviction API takes worker 1 of an elastic KeepSurvivors job that does not
    replace before leaving. Before it is gone the operator has already published the smaller
    generation with the survivor in it, and created the replacement under index 2 (index 1's
    name is still taken) for the next generation; the job grows back to it when it runs. The
    survivor is never restarted, nothing is charged."""
    jobs.apply(
        torchjob(
            "shrinky",
            replicas=2,
            membershipPolicy="KeepSurvivors",
            elastic={
                "minReplicas": 1,
                "maxReplicas": 2,
                "shrinkOnDisruption": True,
                "replaceBeforeLeaving": False,
            },
            failurePolicy={"maxRestarts": 0},
        )
    )
    before = {p.metadata.name: p.metadata.uid for p in jobs.wait_running_pods("shrinky", 2, 0)}
    jobs.wait_phase("shrinky", "Running")
    evict_held(jobs, "shrinky-worker-1")
    try:
        # Smaller at once (generation 1), then back to 2 with the replacement, created under
        # index 2 while pod 1 still holds its name: all before the evicted pod is gone.
        status = jobs.wait(
            "shrinky",
            lambda s: (
                s if s.get("currentGeneration") == 2 and s.get("phase") == "Running" else None
            ),
            "grown back to 2",
        )
        assert status["members"] == [0, 2]
        assert (status["replicas"], status["disruptions"], status["restarts"]) == (2, 1, 0)
        jobs.wait_events("shrinky", "ShrunkAfterDisruption", "CreatedJoiner", "ScaledUp")
        evictee = jobs.core.read_namespaced_pod("shrinky-worker-1", jobs.ns)
        assert evictee.metadata.deletion_timestamp is not None
        assert evictee.metadata.uid == before["shrinky-worker-1"], "still terminating"
        conditions = {c.type: c.reason for c in evictee.status.conditions or []}
        assert conditions.get("DisruptionTarget") == "EvictionByEvictionAPI"
    finally:
        release(jobs, "shrinky-worker-1")
    pods = jobs.wait_running_pods("shrinky", 2, generation=2)
    after = {p.metadata.name: p for p in pods}
    assert set(after) == {"shrinky-worker-0", "shrinky-worker-2"}
    assert after["shrinky-worker-0"].metadata.uid == before["shrinky-worker-0"]
    joiner = env_of(after["shrinky-worker-2"])
    assert (joiner[contract.GENERATION], joiner[contract.WORLD_SIZE]) == ("2", "2")


def test_an_evicted_pod_trains_on_until_its_replacement_takes_its_place(jobs: Jobs) -> None:
    """elastic.replaceBeforeLeaving (the default): the Eviction API takes worker 1 (a
    finalizer keeps it terminating, as its drain would). The generation does not change: the
    replacement is created at once under index 2 and, once Ready, takes pod 1's place in one
    generation at full size (one re-formation), counted as a disruption."""
    manifest = torchjob(
        "drain",
        replicas=2,
        membershipPolicy="KeepSurvivors",
        elastic={"minReplicas": 1, "maxReplicas": 2, "shrinkOnDisruption": True},
        failurePolicy={"maxRestarts": 0},
    )
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60
    jobs.apply(manifest)
    before = {p.metadata.name: p.metadata.uid for p in jobs.wait_running_pods("drain", 2, 0)}
    drain_s = env_of(jobs.core.read_namespaced_pod("drain-worker-1", jobs.ns))[contract.DRAIN_S]
    assert drain_s == "50", "the grace period less the margin"
    jobs.wait_phase("drain", "Running")
    evict_held(jobs, "drain-worker-1")
    try:
        status = jobs.wait(
            "drain",
            lambda s: s if s.get("currentGeneration") == 1 else None,
            "the replacement in the evicted pod's place",
        )
        assert status["members"] == [0, 2] and status["replicas"] == 2
        assert (status["disruptions"], status["restarts"]) == (1, 0)
        assert status["replacedWorkers"] == ["drain-worker-1"]
        evictee = jobs.core.read_namespaced_pod("drain-worker-1", jobs.ns)
        assert evictee.metadata.uid == before["drain-worker-1"], "it trained on meanwhile"
        assert evictee.metadata.deletion_timestamp is not None
        reasons = jobs.event_reasons("drain")
        assert "ShrunkAfterDisruption" not in reasons, ", ".join(reasons)
        jobs.wait_events(
            "drain", "CreatedJoiner", "ReplacingBeforeLeaving", "ReplacedBeforeLeaving"
        )
    finally:
        release(jobs, "drain-worker-1")
    pods = jobs.wait_running_pods("drain", 2, generation=1)
    after = {p.metadata.name: p for p in pods}
    assert set(after) == {"drain-worker-0", "drain-worker-2"}
    assert after["drain-worker-0"].metadata.uid == before["drain-worker-0"], "never restarted"
    status = jobs.wait_phase("drain", "Running")
    assert status["currentGeneration"] == 1


def test_node_lost_is_a_disruption(jobs: Jobs, cluster: k.Cluster) -> None:
    """Worker 0's node reports NotReady: the job goes on in a new generation (a disruption,
    the restart budget untouched), its pods kept off that node.

    Which generation runs is not always the one the loss began. The pods tolerate the
    node's NoExecute taint for 1 s, and the taint manager (taint-eviction-controller,
    Kubernetes 1.37) deletes the pod it marked *by name*, with no UID precondition, retrying
    a NotFound 5 times 10 ms apart: when its timer fires as kwok removes the old worker 0
    (deleted by the operator 2 s earlier), it can find and delete the replacement the operator
    has just made under the same name, on a healthy node. The operator rightly counts that as
    another disruption (DeletionByTaintManager) and begins the next generation, which runs
    (a local `make test`, 2026-12-06: generation 2 Running 3.5 s after the loss, while the
    test waited 270 s for generation 1). So the test waits for the job's current generation."""
    fast_eviction = [
        {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}
        for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]
    manifest = torchjob(
        "on-bad-node",
        replicas=2,
        template=worker_template(tolerations=fast_eviction, terminationGracePeriodSeconds=2),
        failurePolicy={"maxRestarts": 0},
    )
    jobs.apply(manifest)
    pods = jobs.wait_running_pods("on-bad-node", 2, generation=0)
    node = pods[0].spec.node_name
    k.make_node_not_ready(jobs.core, node)
    try:
        status = jobs.wait(
            "on-bad-node",
            lambda s: s if s.get("disruptions", 0) >= 1 else None,
            "a disruption",
            timeout=90,
        )
        assert status["restarts"] == 0
        status, pods = jobs.wait_current_pods(
            "on-bad-node", 2, since=status["currentGeneration"], timeout=90
        )
        # Every generation since the first began with a disruption: nothing restarted.
        assert (status["restarts"], status["disruptions"]) == (0, status["currentGeneration"]), (
            status.get("history")
        )
        assert node not in {p.spec.node_name for p in pods}, (
            "the new generation avoids the lost node"
        )
        disrupted = next(
            e
            for e in jobs.wait_events("on-bad-node", "WorkerDisrupted")
            if e.reason == "WorkerDisrupted"
        )
        # The operator's Node watch usually sees the node first (NodeLost); the taint manager's
        # eviction, a second later, says the same in its own words.
        said = disrupted.message
        assert any(w in said for w in ("NodeLost", "DeletionByTaintManager", "deleted")), said
    finally:
        k.restore_node_ready(jobs.core, node, untaint=True)


# --- user operations -----------------------------------------------------------------------


def test_kubectl_scale_starts_a_new_generation(jobs: Jobs) -> None:
    jobs.apply(torchjob("scaled", replicas=2, elastic={"minReplicas": 1, "maxReplicas": 4}))
    jobs.wait_running_pods("scaled", 2, generation=0)
    jobs.kubectl("scale", "tj/scaled", "--replicas=3")
    pods = jobs.wait_running_pods("scaled", 3, generation=1)
    assert env_of(pods[2])[contract.WORLD_SIZE] == "3"
    status = jobs.wait_phase("scaled", "Running")
    assert (status["replicas"], status["restarts"], status["disruptions"]) == (3, 0, 0)
    jobs.wait_events("scaled", "Rescaled")
    out = jobs.kubectl("scale", "tj/scaled", "--replicas=9", check=False)
    assert out.returncode != 0
    assert (
        "spec.replicas must lie between spec.elastic.minReplicas and spec.elastic.maxReplicas"
        in out.stderr
    )


def test_suspend_and_resume(jobs: Jobs) -> None:
    jobs.apply(torchjob("pausable", replicas=2))
    jobs.wait_running_pods("pausable", 2, generation=0)
    jobs.kubectl(
        "patch", "tj/pausable", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}'
    )
    jobs.wait_phase("pausable", "Suspended")
    k.wait_for(lambda: not jobs.pods("pausable"), 30, "suspended job's pods deleted")
    jobs.kubectl(
        "patch", "tj/pausable", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}'
    )
    jobs.wait_running_pods("pausable", 2, generation=1)
    status = jobs.wait_phase("pausable", "Running")
    assert (status["restarts"], status["disruptions"]) == (0, 0)
    jobs.wait_events("pausable", "Suspended", "Resumed")


def test_active_deadline_is_enforced_with_nothing_else_happening(jobs: Jobs) -> None:
    jobs.apply(torchjob("slow", replicas=1, runPolicy={"activeDeadlineSeconds": 3}))
    jobs.wait_running_pods("slow", 1, generation=0)
    status = jobs.wait_phase("slow", "Failed", timeout=30)
    assert (
        next(c for c in status["conditions"] if c["type"] == "Failed")["reason"]
        == "DeadlineExceeded"
    )
    k.wait_for(lambda: not jobs.pods("slow"), 30, "running pods deleted at the deadline")


def test_ttl_deletes_the_finished_job(jobs: Jobs) -> None:
    jobs.apply(torchjob("short-lived", replicas=1, runPolicy={"ttlSecondsAfterFinished": 2}))
    pods = jobs.wait_running_pods("short-lived", 1, generation=0)
    jobs.exit_pod(pods[0].metadata.name, 0)
    jobs.wait_phase("short-lived", "Succeeded")
    k.wait_for(lambda: jobs.get("short-lived") is None, 30, "TorchJob deleted after its TTL")


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"replicas": 5, "elastic": {"minReplicas": 1, "maxReplicas": 4}},
            "spec.replicas must lie between spec.elastic.minReplicas and spec.elastic.maxReplicas",
            id="replicas-above-max",
        ),
        pytest.param(
            {"elastic": {"minReplicas": 3, "maxReplicas": 2}},
            "spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas",
            id="min-above-max",
        ),
        pytest.param(
            {"nprocPerNode": "lots"},
            "spec.nprocPerNode must be an integer from 1 to 1024",
            id="bad-nproc",
        ),
        pytest.param({"replicas": 0}, "spec.replicas", id="zero-replicas"),
        pytest.param(
            {"template": {"spec": {"containers": []}}},
            "spec.template.spec.containers",
            id="no-containers",
        ),
        pytest.param(
            {"failurePolicy": {"permanentExitCodes": [3], "retryableExitCodes": [3]}},
            "cannot be both retryable and permanent",
            id="exit-code-in-both-lists",
        ),
        pytest.param(
            {"checkpoint": {}}, "spec.checkpoint needs a path", id="checkpoint-without-storage"
        ),
    ],
)
def test_invalid_manifests_are_rejected_with_their_message(
    jobs: Jobs, spec: dict[str, Any], message: str
) -> None:
    manifest = torchjob("invalid", replicas=2)
    manifest["spec"].update(spec)
    out = jobs.kubectl(
        "apply", "--server-side", "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert out.returncode != 0
    assert message in out.stderr


def test_immutable_fields_cannot_change(jobs: Jobs) -> None:
    jobs.apply(torchjob("fixed", replicas=1, backend="gloo"))
    out = jobs.kubectl(
        "patch", "tj/fixed", "--type=merge", "-p", '{"spec":{"backend":"nccl"}}', check=False
    )
    assert out.returncode != 0
    assert "spec.backend is immutable" in out.stderr
    # Nor can one be added: the CRD has no defaults (a runtime blueprint may fill them).
    out = jobs.kubectl(
        "patch", "tj/fixed", "--type=merge", "-p", '{"spec":{"nprocPerNode":2}}', check=False
    )
    assert out.returncode != 0
    assert "spec.nprocPerNode is immutable" in out.stderr


def test_pod_template_the_api_server_rejects_gives_a_condition_not_a_crash(jobs: Jobs) -> None:
    manifest = torchjob("broken-template", replicas=1)
    # The CRD rejects what its schema and CEL rules can see (issue 7); Pod validation still has
    # rules of its own, such as a uid range, that only pod creation reports.
    manifest["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"runAsUser": -1}
    jobs.apply(manifest)
    status = jobs.wait(
        "broken-template",
        lambda s: (
            s
            if any(
                c["type"] == "Stalled" and c["status"] == "True" for c in s.get("conditions", [])
            )
            else None
        ),
        "Stalled condition",
    )
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "FailedCreatePod"
    assert "runAsUser" in stalled["message"], stalled["message"]
    jobs.wait_events("broken-template", "FailedCreatePod")
    assert jobs.operator.proc is not None and jobs.operator.proc.poll() is None, (
        "the operator must keep running"
    )
    # The operator still serves other jobs.
    jobs.apply(torchjob("healthy", replicas=1))
    jobs.wait_running_pods("healthy", 1, generation=0)


def test_a_worker_whose_image_cannot_be_pulled_is_explained(jobs: Jobs) -> None:
    manifest = torchjob("no-image", replicas=2)
    # kwok holds these containers in ImagePullBackOff, as a kubelet does for a wrong image.
    manifest["spec"]["template"]["metadata"] = {
        "annotations": {k.WAITING_REASON_ANNOTATION: "ImagePullBackOff"}
    }
    jobs.apply(manifest)

    def ready_reason(s: dict) -> dict | None:
        ready = next((c for c in s.get("conditions", []) if c["type"] == "Ready"), None)
        # Both pods, eventually: the first pull failure is written at once, the second only
        # changes the count in the message (it may wait up to a second to fold in).
        both = ready and ready["message"].startswith("2 of 2 workers cannot start")
        return ready if ready and ready["reason"] == "ImagePullFailed" and both else None

    ready = jobs.wait("no-image", ready_reason, "Ready=False, ImagePullFailed, 2 of 2 workers")
    assert ready["status"] == "False"
    assert ready["message"].startswith("2 of 2 workers cannot start (e.g. no-image-worker-0: ")
    assert "ImagePullBackOff" in ready["message"]
    events = jobs.wait_events("no-image", "ImagePullFailed")
    assert {e.type for e in events if e.reason == "ImagePullFailed"} == {"Warning"}
    assert jobs.status("no-image")["phase"] == "Starting"
    described = jobs.kubectl("describe", "tj", "no-image").stdout
    assert "ImagePullFailed" in described and "cannot start" in described


# --- robustness ----------------------------------------------------------------------------


def test_operator_killed_mid_reconcile_restarts_without_duplicates(jobs: Jobs) -> None:
    jobs.apply(torchjob("sturdy", replicas=16))
    # Kill the operator while it is creating the pods.
    k.wait_for(lambda: len(jobs.pods("sturdy")) > 0, 30, "the first pods of sturdy")
    jobs.operator.kill()
    jobs.operator.start()
    pods = jobs.wait_running_pods("sturdy", 16, generation=0, timeout=120)
    names = [p.metadata.name for p in pods]
    assert len(names) == len(set(names)) == 16
    status = jobs.wait_phase("sturdy", "Running")
    assert (status["currentGeneration"], status["restarts"], status["disruptions"]) == (0, 0, 0)
    reasons = jobs.event_reasons("sturdy")
    assert "DeletedPod" not in reasons, "no pod was deleted and recreated"
    assert reasons.count("CreatedPod") <= 16


def test_examples_validate_against_the_installed_crd(jobs: Jobs) -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        out = jobs.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
        assert out.returncode == 0, f"{path.name}: {out.stderr}"


# --- elastic ---------------------------------------------------------------------------------


def test_elastic_job_shrinks_to_capacity_and_grows_back(jobs: Jobs) -> None:
    """4 workers wanted, room for 2: continue with 2; room again: probes fit, grow to 4."""
    key = "torchjob.io/elastic-test"
    tag = uuid.uuid4().hex[:8]
    taint = {"key": key, "value": tag, "effect": "NoSchedule"}
    nodes = [f"elastic-{tag}-{i}" for i in range(4)]
    template = worker_template(
        nodeSelector={key: tag},
        tolerations=[{"key": key, "operator": "Equal", "value": tag, "effect": "NoSchedule"}],
    )
    template["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    elastic = {
        "minReplicas": 2,
        "maxReplicas": 4,
        "scaleDownAfterSeconds": 2,
        "scaleUpCooldownSeconds": 3,
    }
    try:
        for node in nodes[:2]:
            k.add_fake_node(jobs.core, node, gpus=8, labels={key: tag}, taints=[taint])
        jobs.apply(torchjob("stretchy", replicas=4, elastic=elastic, template=template))
        status = jobs.wait(
            "stretchy",
            lambda s: s if s.get("replicas") == 2 else None,
            "shrunk to 2 workers",
            timeout=90,
        )
        shrunk_gen = status["currentGeneration"]
        jobs.wait_running_pods("stretchy", 2, generation=shrunk_gen, timeout=60)
        status = jobs.wait_phase("stretchy", "Running")
        assert (status["restarts"], status["disruptions"]) == (0, 0), "a shrink is neither"
        jobs.wait_events("stretchy", "ScaledDown")
        assert jobs.get("stretchy")["spec"]["replicas"] == 4, "the desired size is kept"

        for node in nodes[2:]:
            k.add_fake_node(jobs.core, node, gpus=8, labels={key: tag}, taints=[taint])
        status = jobs.wait(
            "stretchy",
            lambda s: s if s.get("replicas") == 4 else None,
            "grown back to 4",
            timeout=90,
        )
        pods = jobs.wait_running_pods(
            "stretchy", 4, generation=status["currentGeneration"], timeout=60
        )
        assert {p.spec.node_name for p in pods} == set(nodes)
        jobs.wait_events("stretchy", "CreatedProbe", "ScaledUp")
        k.wait_for(
            lambda: (
                not [
                    p
                    for p in jobs.core.list_namespaced_pod(jobs.ns).items
                    if "-probe-" in p.metadata.name
                ]
            ),
            30,
            "probe pods removed after the grow",
        )
    finally:
        for node in nodes:
            k.delete_node(jobs.core, node)
