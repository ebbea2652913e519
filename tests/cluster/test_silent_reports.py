"""Silent-peer reports of several survivors against the real API server: each survivor
applies its own entries of ``status.silentWorkers`` (a list map keyed by reporter and pod)
with the worker pods' ServiceAccount, and every report is kept, those written at the same
moment included; the operator's own status writes leave them alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION, Phase, TorchJobStatus
from torchjob.train.job_status import JobEndpoint
from torchjob.train.recovery.reports import SilentReports
from torchjob_operator.engine.client import KubeClient
from torchjob_operator.resources.rbac import worker_rbac
from torchjob_operator.torchjob.silent import trusted_reports

JOB = "tj"
PODS = [contract.worker_pod_name(JOB, i) for i in (0, 1)]


def worker_endpoint(kube: Any, namespace: str, uid: str, sa_dir: Path) -> JobEndpoint:
    """The job's status as a worker pod reaches it: the operator's per-job ServiceAccount,
    Role and RoleBinding (``resources.rbac``), a token of that account, the cluster's CA."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    create: dict[str, Callable[[str, dict[str, Any]], Any]] = {
        "ServiceAccount": core.create_namespaced_service_account,
        "Role": rbac.create_namespaced_role,
        "RoleBinding": rbac.create_namespaced_role_binding,
    }
    for kind, body in worker_rbac(name=JOB, namespace=namespace, uid=uid):
        create[kind](namespace, body)
    account = contract.worker_service_account(JOB)
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    token = k.wait_for(
        lambda: core.create_namespaced_service_account_token(account, namespace, request),
        30,
        f"a token of ServiceAccount {account}",
        ignore=(ApiException,),
    ).status.token
    sa_dir.mkdir()
    (sa_dir / "token").write_text(token)
    conf = kube.configuration
    if conf.ssl_ca_cert:
        (sa_dir / "ca.crt").write_bytes(Path(conf.ssl_ca_cert).read_bytes())
    endpoint = JobEndpoint(
        api_url=conf.host.rstrip("/"), serviceaccount_dir=sa_dir, namespace=namespace, name=JOB
    )

    # The authorizer sees a new RoleBinding a moment later.
    k.wait_for(lambda: endpoint.call("GET"), 30, "the worker's Role in effect", ignore=(OSError,))
    return endpoint


def at_once(*writes: Callable[[], Any]) -> list[BaseException]:
    """Run ``writes`` on threads released together by a barrier; what they raised."""
    barrier = threading.Barrier(len(writes))
    errors: list[BaseException] = []

    def run(write: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            write()
        except (ApiException, OSError, threading.BrokenBarrierError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in writes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


def test_concurrent_reports_of_a_partition_are_all_kept_and_rank_0s_view_wins(
    kube: Any, crd: None, namespace: str, tmp_path: Path
) -> None:
    """Pods 0 and 1 lose each other (a partition): each reports the other at the same moment
    (two threads released by a barrier, with the runtime's writes and the worker's token),
    and the operator writes its status at that moment too. Both reports stay (a merge patch
    of the list kept only the last one), so the partition rule sees both sides: the pod that
    runs rank 0 wins. Every round is a new generation, in which pod 1 runs rank 0 every other
    time; each reporter's apply replaces its last generation's entry."""
    custom = client.CustomObjectsApi(kube)
    manifest = torchjob(JOB, membershipPolicy="KeepSurvivors", runPolicy={"suspend": True})
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    endpoint = worker_endpoint(kube, namespace, job["metadata"]["uid"], tmp_path / "sa")
    reporters = [
        SilentReports(endpoint, contract.PodEnv(JOB, namespace, i, 2, 1, 0, PODS[0]))
        for i in (0, 1)
    ]
    operator = KubeClient(kube)
    for generation in range(6):
        ranked = (0, 1) if generation % 2 == 0 else (1, 0)
        for reporter, index in zip(reporters, (0, 1), strict=True):
            peer_rank = ranked.index(1 - index)
            assert reporter.record(ranked, generation, peer_rank, 5.0 + index)
        ours = TorchJobStatus(phase=Phase.SUSPENDED, current_generation=generation).to_patch()
        errors = at_once(
            *(r.write for r in reporters),
            lambda s=ours: operator.patch_job_status(namespace, JOB, s),
        )
        assert not errors, errors
        status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, JOB)[
            "status"
        ]
        assert status["phase"] == "Suspended", status
        stored = TorchJobStatus.parse(status).silent_workers or []
        assert sorted((r.by, r.pod, r.generation) for r in stored) == [
            (PODS[0], PODS[1], generation),
            (PODS[1], PODS[0], generation),
        ], status
        members = [PODS[i] for i in ranked]
        assert set(trusted_reports(stored, generation, members)) == {members[1]}, stored


def test_a_group_every_member_says_broke_re_forms_the_same_pods(
    jobs: Jobs, kube: Any, tmp_path: Path
) -> None:
    """bench/results/2026-12-03a: every member's group broke (``Connection closed by peer``)
    with no pod lost, and each waited for a generation that nothing published. Each member's
    runtime now says so about itself (``SilentReports.broken``, with the worker's token);
    once both have, the operator publishes the next generation with the same two pods (the
    same uids, relabelled, nothing created), uncharged, and says why."""
    name = "broke"
    jobs.apply(torchjob(name, membershipPolicy="KeepSurvivors"))
    before = {p.metadata.name: p.metadata.uid for p in jobs.wait_running_pods(name, 2, 0)}
    jobs.wait_phase(name, "Running")
    core, account = client.CoreV1Api(kube), contract.worker_service_account(name)
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    token = k.wait_for(  # the operator creates the worker account with the pods
        lambda: core.create_namespaced_service_account_token(account, jobs.ns, request),
        30,
        f"a token of ServiceAccount {account}",
        ignore=(ApiException,),
    ).status.token
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    if kube.configuration.ssl_ca_cert:
        (sa / "ca.crt").write_bytes(Path(kube.configuration.ssl_ca_cert).read_bytes())
    host = kube.configuration.host.rstrip("/")
    endpoint = JobEndpoint(api_url=host, serviceaccount_dir=sa, namespace=jobs.ns, name=name)
    k.wait_for(lambda: endpoint.call("GET"), 30, "the worker's Role in effect", ignore=(OSError,))

    for index in (0, 1):
        pod = contract.PodEnv(name, jobs.ns, index, 2, 1, 0, f"{name}-worker-0")
        SilentReports(endpoint, pod).broken(0)  # on a thread, as the runtime does
    status = jobs.wait(
        name,
        lambda s: s if s.get("currentGeneration") == 1 else None,
        "the next generation, once both members said their group broke",
    )
    assert (status["replicas"], status["restarts"], status["disruptions"]) == (2, 0, 0), status
    assert status["history"][-1]["cause"] == "GroupBroken", status["history"]
    assert status["losses"] == {"GroupBroken": 1}, status
    broken = [w for w in status["silentWorkers"] if w.get("how") == "broken"]
    assert sorted((w["pod"], w["by"]) for w in broken) == [(n, n) for n in sorted(before)]
    after = jobs.wait_running_pods(name, 2, generation=1)
    assert {p.metadata.name: p.metadata.uid for p in after} == before, "the same pods, kept"
    said = next(e for e in jobs.wait_events(name, "GroupBroken") if e.reason == "GroupBroken")
    assert said.type == "Warning" and "not charged" in said.message, said.message
