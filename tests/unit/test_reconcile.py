"""``reconcile_once`` over an in-memory ``Kube`` and a fake clock: the adapter's order.

The cluster tests (tests/cluster/test_chaos.py) are the proof against the real API
server; this one makes the order of the writes cheap to check exhaustively: the
operator "crashes" (an exception) at every mutating call in turn, then runs again,
and the counters must be exactly what one uninterrupted run gives.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from torchjob import contract
from torchjob_operator.engine.kube import EarlierOwnerError, Kube, KubeError
from torchjob_operator.engine.settings import OperatorSettings
from torchjob_operator.torchjob import controller, writes
from torchjob_operator.torchjob.controller import reconcile_once

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
MUTATING = ("create_pod", "patch_job_status", "label_pod", "delete_pod")


class Crash(Exception):
    """The operator died here."""


class FakeKube:
    """A namespace in memory: one TorchJob, its pods; deletions are immediate (grace 0)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.job: dict[str, Any] = {
            "apiVersion": "torchjob.io/v1alpha1",
            "kind": "TorchJob",
            "metadata": {"name": "tj", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": spec,
            "status": {},
        }
        self.pods: dict[str, dict[str, Any]] = {}
        self.pod_groups: dict[str, dict[str, Any]] = {}
        self.pod_group_error: Exception | None = None
        self.calls: list[str] = []
        self.crash_at: int | None = None
        """Raise Crash instead of the crash_at-th mutating call (0-based)."""
        self.mutations = 0
        self.events: list[tuple[str, str]] = []
        self.runtimes: dict[tuple[str, str], dict[str, Any]] = {}
        """Runtime blueprints by (kind, name) (spec.runtimeRef)."""

    def _mutate(self, what: str) -> None:
        if self.crash_at is not None and self.mutations == self.crash_at:
            self.crash_at = None
            raise Crash(what)
        self.mutations += 1
        self.calls.append(what)

    # --- Kube --------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    def list_jobs(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        return [("ns", "tj")]

    def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        self._mutate("patch_job_status")
        merged = dict(self.job["status"])
        for k, v in status.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = copy.deepcopy(v)
        self.job["status"] = merged
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        raise AssertionError("not in these scenarios")

    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods.values()]

    def create_pod(self, body: dict[str, Any]) -> bool:
        name = body["metadata"]["name"]
        if name in self.pods:
            return False
        self._mutate("create_pod")
        self.pods[name] = {**copy.deepcopy(body), "status": {"phase": "Pending"}}
        return True

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool:
        if name not in self.pods:
            return False
        self._mutate("label_pod")
        self.pods[name]["metadata"]["labels"].update(labels)
        return True

    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> bool:
        if name not in self.pods:
            return False
        assert uid is None or self.pods[name]["metadata"].get("uid") in (None, uid)
        self._mutate("delete_pod")
        del self.pods[name]
        return True

    def ensure_service(self, body: dict[str, Any]) -> bool:
        return False

    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool:
        return False

    def apply_pod_group(self, body: dict[str, Any]) -> bool:
        if self.pod_group_error is not None:
            raise self.pod_group_error
        self.pod_groups[body["metadata"]["name"]] = body
        return True

    # Kueue: the Workloads the operator writes (no Kueue here: nothing admits them).
    workloads: dict[str, dict[str, Any]]

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return getattr(self, "workloads", {}).get(name)

    def create_workload(self, body: dict[str, Any]) -> bool:
        store = self.__dict__.setdefault("workloads", {})
        if body["metadata"]["name"] in store:
            return False
        store[body["metadata"]["name"]] = body
        return True

    def delete_workload(self, namespace: str, name: str, uid: str) -> bool:
        return self.__dict__.setdefault("workloads", {}).pop(name, None) is not None

    def patch_workload_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        wl = self.__dict__.setdefault("workloads", {}).get(name)
        if wl is None:
            return False
        wl.setdefault("status", {}).update(patch["status"])
        return True

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        return None

    def node_labels(self, label_selector: str) -> dict[str, dict[str, str]]:
        return {}

    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get_runtime:{kind}/{name}")
        found = self.runtimes.get((kind, name))
        return copy.deepcopy(found) if found is not None else None

    def post_event(
        self, job: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        self.calls.append(f"event:{reason}")
        self.events.append((reason, message))

    # --- the kubelet and the cluster ---------------------------------------------------
    def run_all(self) -> None:
        for p in self.pods.values():
            if p["status"]["phase"] == "Pending":
                p["spec"]["nodeName"] = "node-1"
                p["status"] = {
                    "phase": "Running",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"},
                    ],
                }

    def exit(self, name: str, code: int) -> None:
        self.pods[name]["status"] = {
            "phase": "Failed" if code else "Succeeded",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Error",
                            "finishedAt": "2026-01-01T00:00:05Z",
                        }
                    },
                }
            ],
        }

    def evict(self, name: str) -> None:
        del self.pods[name]


def _spec(replicas: int = 3) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "failurePolicy": {"maxRestarts": 3, "backoff": {"initialSeconds": 5, "maxSeconds": 5}},
        "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
    }


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _reconcile(kube: Kube, clock: Clock) -> None:
    reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)


def _settle(kube: FakeKube, clock: Clock, passes: int = 8) -> None:
    """Reconcile until nothing changes, as the operator's loop would (requeues included)."""
    for _ in range(passes):
        _reconcile(kube, clock)
        kube.run_all()
        clock.now += timedelta(seconds=6)  # past any backoff of these scenarios


def _generations(kube: FakeKube) -> set[int]:
    return {int(p["metadata"]["labels"][contract.LABEL_GENERATION]) for p in kube.pods.values()}


def _running_job(clock: Clock) -> FakeKube:
    kube = FakeKube(_spec())
    _settle(kube, clock, passes=3)
    assert kube.job["status"]["phase"] == "Running"
    assert _generations(kube) == {0} and len(kube.pods) == 3
    return kube


def test_the_decision_is_written_before_any_older_pod_is_deleted() -> None:
    clock = Clock()
    kube = _running_job(clock)
    kube.exit("tj-worker-1", 1)
    kube.calls.clear()
    _reconcile(kube, clock)
    mutations = [c for c in kube.calls if c in MUTATING]
    assert mutations[0] == "patch_job_status", kube.calls
    assert mutations[1:] == ["delete_pod"] * 3
    status = kube.job["status"]
    assert (status["currentGeneration"], status["restarts"], status["disruptions"]) == (1, 1, 0)
    # Events only after the status landed.
    assert kube.calls.index("patch_job_status") < kube.calls.index("event:WorkerFailed")


def test_one_event_per_reconcile_for_its_pods_not_one_per_pod() -> None:
    # An Event is a write to the API server: 3 pods created is one Event, 3 deleted another.
    clock = Clock()
    kube = FakeKube(_spec())
    _reconcile(kube, clock)
    created = [m for r, m in kube.events if r == "CreatedPod"]
    assert created == ["created 3 pods: tj-worker-0, tj-worker-1, tj-worker-2 (generation 0)"]
    kube.run_all()
    kube.exit("tj-worker-1", 1)
    kube.events.clear()
    _reconcile(kube, clock)
    deleted = [m for r, m in kube.events if r == "DeletedPod"]
    assert deleted == ["deleted 3 pods: tj-worker-0, tj-worker-1, tj-worker-2"]


def _scenario(inject: str) -> FakeKube:
    clock = Clock()
    kube = _running_job(clock)
    if inject == "failure":
        kube.exit("tj-worker-1", 1)
    else:
        kube.evict("tj-worker-2")
    return kube


@pytest.mark.parametrize(("inject", "expected"), [("failure", (1, 1, 0)), ("eviction", (1, 0, 1))])
def test_a_crash_at_any_write_replays_the_same_decision(
    inject: str, expected: tuple[int, int, int]
) -> None:
    # How many mutating calls one uninterrupted recovery takes.
    clean = _scenario(inject)
    start = clean.mutations
    _settle(clean, _clock_after(T0))
    total = clean.mutations - start
    assert total >= 4
    for crash_at in range(total):
        kube = _scenario(inject)
        clock = _clock_after(T0)
        kube.crash_at = kube.mutations + crash_at
        with pytest.raises(Crash):
            for _ in range(8):
                _reconcile(kube, clock)
                kube.run_all()
                clock.now += timedelta(seconds=6)
        _settle(kube, clock)
        status = kube.job["status"]
        got = (status["currentGeneration"], status["restarts"], status["disruptions"])
        assert got == expected, f"crash before mutation {crash_at}: {status}"
        assert status["phase"] == "Running"
        assert _generations(kube) == {1} and len(kube.pods) == 3, kube.pods.keys()
        if inject == "failure":
            assert status["lastFailure"]["pod"] == "tj-worker-1"


def _clock_after(t: datetime) -> Clock:
    c = Clock()
    c.now = t + timedelta(seconds=30)
    return c


def _invalid_spec_calls(kube: FakeKube) -> None:
    """First reconcile: one status patch (Ready=False, Stalled=True, reason InvalidSpec), then
    one Warning Event, no pod, no requeue; the next reconcile writes nothing (no hot loop)."""
    clock = Clock()
    outcome = reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)
    assert outcome.requeue_after_s is None and not outcome.gone
    assert kube.pods == {}
    assert kube.calls == ["patch_job_status", "event:InvalidSpec"]
    conditions = {c["type"]: c for c in kube.job["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == conditions["Ready"]["reason"] == "InvalidSpec"
    assert kube.job["status"]["observedGeneration"] == 1
    clock.now += timedelta(minutes=5)
    _reconcile(kube, clock)
    assert kube.calls == ["patch_job_status", "event:InvalidSpec"]


def test_an_error_while_building_pods_is_invalid_spec_on_the_first_reconcile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any exception judging or building a job's objects is the spec's (the builders are pure),
    so it is reported, not retried: the operator never crashes in a loop on an accepted job."""

    def broken(**_: Any) -> dict[str, Any]:
        raise OverflowError("something no rule foresaw")

    monkeypatch.setattr(writes, "worker_pod", broken)
    kube = FakeKube(_spec())
    _invalid_spec_calls(kube)
    message = {c["type"]: c for c in kube.job["status"]["conditions"]}["Stalled"]["message"]
    assert message == (
        "TorchJob ns/tj cannot be run as specified: OverflowError: something no rule foresaw"
    )


def test_a_spec_the_model_rejects_is_invalid_spec_on_the_first_reconcile() -> None:
    """A TorchJob stored under an older, laxer CRD: the model's error names the field."""
    kube = FakeKube({**_spec(), "replicas": 0})
    _invalid_spec_calls(kube)
    message = {c["type"]: c for c in kube.job["status"]["conditions"]}["Stalled"]["message"]
    assert message.startswith("TorchJob ns/tj has an invalid spec: spec.replicas:"), message


def _start(kube: FakeKube, name: str) -> None:
    kube.pods[name]["spec"]["nodeName"] = "node-1"
    kube.pods[name]["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
    }


def test_worker_counts_wait_for_the_next_write_but_a_phase_never_waits() -> None:
    clock = Clock()
    kube = FakeKube(_spec(replicas=4))
    settings = OperatorSettings(progress_batch_s=1.0)

    def once(defer: bool) -> controller.ReconcileResult:
        return reconcile_once(
            kube, "ns", "tj", settings=settings, clock=clock, defer_progress=defer
        )

    assert not once(True).deferred, "creating the pods is written at once"
    names = sorted(kube.pods)
    kube.calls.clear()
    for name in names[:3]:
        _start(kube, name)
        outcome = once(True)
        assert outcome.deferred and outcome.requeue_after_s == 1.0
    assert "patch_job_status" not in kube.calls
    assert kube.job["status"]["workers"] == "0/4"

    # The wait is over (the loop says so): the counts are written.
    outcome = once(False)
    assert not outcome.deferred
    assert kube.calls.count("patch_job_status") == 1
    assert kube.job["status"]["workers"] == "3/4"
    ready = next(c for c in kube.job["status"]["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "3/4 workers ready"

    # The last worker makes the job Running: a phase is never held back.
    _start(kube, names[3])
    assert not once(True).deferred
    assert (kube.job["status"]["phase"], kube.job["status"]["workers"]) == ("Running", "4/4")

    # A failure is a decision, written at once even while counts could wait.
    kube.exit(names[1], 1)
    kube.calls.clear()
    assert not once(True).deferred
    assert kube.calls[0] == "patch_job_status" and kube.job["status"]["restarts"] == 1


# --- a namespace being deleted -----------------------------------------------------------

TERMINATING_BODY = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
    '"pods \\"tj-worker-0\\" is forbidden: unable to create new content in namespace ns '
    'because it is being terminated","reason":"Forbidden","details":{"name":"tj-worker-0",'
    '"kind":"pods","causes":[{"reason":"NamespaceTerminating","message":"namespace ns is '
    'being terminated","field":"metadata.namespace"}]},"code":403}'
)
"""What kube-apiserver 1.37 answers to a create in a terminating namespace (copied from one)."""


def _api_error(status: int, body: str) -> KubeError:
    exc = ApiException(status=status, reason="Forbidden")
    exc.body = body
    return KubeError("create", "pod ns/tj-worker-0", exc)


def test_a_terminating_namespace_is_told_apart_from_other_refusals() -> None:
    assert _api_error(403, TERMINATING_BODY).namespace_terminating
    other = '{"kind":"Status","message":"no PriorityClass with name x was found","code":403}'
    assert not _api_error(403, other).namespace_terminating
    assert not _api_error(403, "not json").namespace_terminating
    assert not _api_error(409, TERMINATING_BODY).namespace_terminating


class DyingNamespaceKube(FakeKube):
    def create_pod(self, body: dict[str, Any]) -> bool:
        raise _api_error(403, TERMINATING_BODY)


def test_pods_refused_by_a_terminating_namespace_neither_stall_nor_warn() -> None:
    """The namespace's deletion takes the job with it: reconcile raises the refusal (the
    loop logs it at info and looks again) instead of writing Stalled and FailedCreatePod."""
    kube = DyingNamespaceKube(_spec())
    with pytest.raises(KubeError) as err:
        _reconcile(kube, Clock())
    assert err.value.namespace_terminating
    assert "patch_job_status" not in kube.calls
    assert not [reason for reason, _ in kube.events if reason == "FailedCreatePod"]


# --- a TorchJob deleted and created again under the same name ------------------------------


def _earlier_jobs_pods(kube: FakeKube, *, terminating: bool) -> None:
    """The pods a deleted TorchJob of the same name (uid u0) left: same names and labels."""
    earlier = FakeKube(_spec())
    earlier.job["metadata"]["uid"] = "u0"
    _reconcile(earlier, Clock())
    earlier.run_all()
    for pod in earlier.pods.values():
        if terminating:
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        kube.pods[pod["metadata"]["name"]] = pod


@pytest.mark.parametrize("terminating", [True, False], ids=["terminating", "not-yet-collected"])
def test_a_same_named_earlier_jobs_pods_are_waited_for_not_counted(terminating: bool) -> None:
    clock = Clock()
    kube = FakeKube(_spec())  # uid u1
    _earlier_jobs_pods(kube, terminating=terminating)
    for _ in range(3):
        _reconcile(kube, clock)
        clock.now += timedelta(seconds=2)
    status = kube.job["status"]
    assert (status["currentGeneration"], status["disruptions"], status["restarts"]) == (0, 0, 0)
    assert "create_pod" not in kube.calls and "delete_pod" not in kube.calls
    assert not [r for r, _ in kube.events if r in ("WorkerDisrupted", "FailedCreatePod")]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "WaitingForEarlierJob", ready
    # The garbage collector (or the kubelet) removes them: this job's generation 0 starts.
    kube.pods.clear()
    _reconcile(kube, clock)
    status = kube.job["status"]
    assert (status["currentGeneration"], status["disruptions"], status["createdGeneration"]) == (
        0,
        0,
        0,
    )
    assert sorted(kube.pods) == ["tj-worker-0", "tj-worker-1", "tj-worker-2"]
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in kube.pods.values()} == {"u1"}


class EarlierAccountKube(FakeKube):
    """The earlier job's ServiceAccount is still there (not yet collected)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.account_collected = False

    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool:
        if kind == "ServiceAccount" and not self.account_collected:
            raise EarlierOwnerError(kind, "ns", body["metadata"]["name"], "u0")
        return False


class RbacOrderKube(FakeKube):
    """The API server checks a RoleBinding's Role at its create: a binding whose Role is not
    there yet is refused (404). The Role's create lingers until the binding is asked for or
    half a second passes, so a binding sent beside its Role is always refused."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.made: list[str] = []
        self.binding_asked = threading.Event()

    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool:
        if kind == "Role":
            self.binding_asked.wait(0.5)
        if kind == "RoleBinding":
            self.binding_asked.set()
            if "Role" not in self.made:
                raise _api_error(404, '{"message": "rolebindings \\"tj-worker\\" not found"}')
        self.made.append(kind)
        return True


def test_a_role_binding_is_created_after_its_role() -> None:
    """Seen on a real API server: every new job's first pass failed with a 404 for its
    RoleBinding (sent beside its Role) and was retried a second later."""
    kube = RbacOrderKube(_spec())
    with ThreadPoolExecutor(4) as pool:  # the operator's writes run concurrently
        reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=Clock(), pool=pool)
    assert kube.made == ["ServiceAccount", "Role", "RoleBinding"]
    assert sorted(kube.pods) == ["tj-worker-0", "tj-worker-1", "tj-worker-2"]


def test_an_earlier_jobs_service_account_is_waited_for_before_any_pod() -> None:
    clock = Clock()
    kube = EarlierAccountKube(_spec())
    outcome = reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)
    assert outcome.requeue_after_s is not None and outcome.requeue_after_s <= 2.0
    assert "create_pod" not in kube.calls
    status = kube.job["status"]
    assert status.get("createdGeneration") is None
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("False", "WaitingForEarlierJob")
    assert "ServiceAccount tj-worker" in stalled["message"]
    kube.account_collected = True
    _reconcile(kube, clock)
    assert sorted(kube.pods) == ["tj-worker-0", "tj-worker-1", "tj-worker-2"]
    assert (kube.job["status"]["currentGeneration"], kube.job["status"]["disruptions"]) == (0, 0)


def test_a_gang_job_gets_its_pod_group_before_its_pods_with_min_member_of_the_generation() -> None:
    clock = Clock()
    spec = _spec(3)
    spec["scheduling"] = {"gang": {"podGroup": "Coscheduling", "scheduleTimeoutSeconds": 90}}
    kube = FakeKube(spec)
    _reconcile(kube, clock)
    group = kube.pod_groups["tj"]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 3, "scheduleTimeoutSeconds": 90}
    assert group["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert all(
        p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "tj" for p in kube.pods.values()
    )
    assert ("CreatedPodGroup", "created PodGroup tj (minMember 3)") in kube.events
    # A scale to 2 is a new generation of 2 pods: minMember follows.
    kube.run_all()
    kube.job["spec"]["replicas"] = 2
    kube.job["metadata"]["generation"] = 2
    _settle(kube, clock)
    assert kube.pod_groups["tj"]["spec"]["minMember"] == 2


def test_a_gang_job_whose_pod_group_cannot_be_created_gets_no_pods_and_says_why() -> None:
    from kubernetes.client.exceptions import ApiException

    from torchjob_operator.engine.kube import KubeError

    clock = Clock()
    spec = _spec(2)
    spec["scheduling"] = {"gang": {"podGroup": "Volcano"}}
    kube = FakeKube(spec)
    kube.pod_group_error = KubeError(
        "create", "PodGroup ns/tj", ApiException(status=404, reason="Not Found")
    )
    _reconcile(kube, clock)
    assert kube.pods == {}
    conditions = {c["type"]: c for c in kube.job["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "FailedCreatePodGroup"
    assert conditions["Stalled"]["status"] == "True"  # 404: the CRD is not installed
    assert "PodGroup ns/tj" in conditions["Ready"]["message"]
    assert any(r == "FailedCreatePodGroup" for r, _ in kube.events)


def test_a_queued_job_runs_only_while_its_workload_is_admitted() -> None:
    """Kueue's protocol end to end over the fake: Workload, admission, eviction, release."""
    clock = Clock()
    kube = FakeKube({**_spec(2), "scheduling": {"queueName": "lq"}})
    _settle(kube, clock, passes=2)
    wl = kube.workloads["torchjob-tj"]
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert wl["spec"]["podSets"][0]["count"] == 2
    assert kube.pods == {} and kube.job["status"]["phase"] == "Suspended"

    admitted = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
        {"type": "Admitted", "status": "True", "reason": "Admitted"},
    ]
    admission = {"clusterQueue": "cq", "podSetAssignments": [{"name": "workers", "flavors": {}}]}
    wl["status"] = {"conditions": admitted, "admission": admission}
    _settle(kube, clock, passes=3)
    assert kube.job["status"]["phase"] == "Running" and len(kube.pods) == 2
    assert all(
        "kueue.x-k8s.io/queue-name" not in p["metadata"]["labels"] for p in kube.pods.values()
    )

    evicted = {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by hi"}
    wl["status"]["conditions"] = [*admitted, evicted]
    _settle(kube, clock, passes=3)
    status = kube.job["status"]
    assert kube.pods == {} and status["phase"] == "Suspended"
    assert (status["restarts"], status["disruptions"]) == (0, 1)
    assert wl["status"]["admission"] is None  # the quota handed back once the pods were gone
    assert (
        "ReleasedQuota",
        "no worker left after the eviction of Workload torchjob-tj: its quota is handed back and Kueue queues it again",
    ) in kube.events


class NoKueueKube(FakeKube):
    """A cluster without Kueue: the Workload API is not served (404 on every request)."""

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # the client reads a 404 as "no such object"

    def create_workload(self, body: dict[str, Any]) -> bool:
        raise _api_error(404, '{"kind":"Status","reason":"NotFound","code":404}')


def test_a_queued_job_runs_ungated_when_kueue_is_not_installed() -> None:
    """As on a batch Job, the queue label is inert without Kueue: the job runs, and says so
    once (a Warning Event), instead of waiting for an admission that nothing would give."""
    kube = NoKueueKube({**_spec(2), "scheduling": {"queueName": "lq"}})
    clock = Clock()
    _reconcile(kube, clock)
    assert sorted(kube.pods) == ["tj-worker-0", "tj-worker-1"]
    assert [r for r, _ in kube.events].count("KueueNotInstalled") == 1
    assert not [r for r, _ in kube.events if r == "FailedWorkload"]
    kube.run_all()
    clock.now += timedelta(seconds=1)
    _reconcile(kube, clock)
    assert kube.job["status"]["phase"] == "Running"
    assert [r for r, _ in kube.events].count("KueueNotInstalled") == 1, "said once"
