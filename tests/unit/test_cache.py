"""The operator's read cache (``torchjob_operator.engine.cache``): what it keeps, and that a
reconcile planned from it never repeats or re-judges a write the watch has not shown yet.

The watches themselves are exercised by every cluster test (the operator reads only the
cache there); here a ``Watch`` stands in for them so the lag can be chosen exactly.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from typing import Any

import pytest
from tests.unit.test_reconcile import Clock, FakeKube, _spec

from torchjob import contract
from torchjob.termination import termination_message
from torchjob_operator.common.nodes import AVOIDED_NODES
from torchjob_operator.common.owners import controller_uid
from torchjob_operator.engine.cache import ALL_NAMESPACES, TOMBSTONE_S, PodExpectation, Store
from torchjob_operator.engine.cached import CachedKube
from torchjob_operator.engine.objects import merge_applied, trim_pod
from torchjob_operator.engine.settings import OperatorSettings
from torchjob_operator.torchjob.controller import reconcile_once
from torchjob_operator.torchjob.observed import DOMAIN_LABEL, PodView, pod_view, probe_view

KEY = ("ns", "tj")


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Watch:
    """Hands the fake API server's state to the store, as kopf's and the pod watch would."""

    def __init__(self, kube: FakeKube, store: Store) -> None:
        self.kube, self.store = kube, store

    def job(self) -> None:
        self.store.put_job(copy.deepcopy(self.kube.job))

    def pods(self) -> None:
        self.store.replace_pods("ns", [copy.deepcopy(p) for p in self.kube.pods.values()])

    def everything(self) -> None:
        self.job()
        self.pods()


class CountingKube(FakeKube):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.reads = 0

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return super().get_job(namespace, name)

    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        self.reads += 1
        return super().list_worker_pods(namespace, job)


def _setup(deadline_s: float = 10.0) -> tuple[CountingKube, Store, CachedKube, Watch, Ticks]:
    ticks = Ticks()
    kube = CountingKube(_spec())
    store = Store(deadline_s=deadline_s, clock=ticks)
    watch = Watch(kube, store)
    watch.everything()
    return kube, store, CachedKube(kube, store), watch, ticks


def _reconcile(kube: CachedKube, clock: Clock) -> None:
    reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)


def test_a_reconcile_reads_the_cache_and_waits_for_the_watch_to_show_its_writes() -> None:
    api, store, cached, watch, _ = _setup()
    clock = Clock()
    _reconcile(cached, clock)
    assert api.calls.count("create_pod") == 3
    assert api.reads == 0, "the job and its pods came from the cache"

    # The watch has shown nothing yet: the loop must not plan from this cache.
    assert store.catching_up(KEY) == pytest.approx(10.0)
    watch.pods()  # the pods arrive, the status patch not yet
    assert store.catching_up(KEY) is not None
    watch.job()
    assert store.catching_up(KEY) is None

    api.calls.clear()
    _reconcile(cached, clock)
    assert "create_pod" not in api.calls
    assert api.reads == 0


def test_a_failure_is_counted_once_however_late_the_watch_is() -> None:
    api, store, cached, watch, _ = _setup()
    clock = Clock()
    for _ in range(3):  # to Running, the watch keeping up
        _reconcile(cached, clock)
        api.run_all()
        watch.everything()
        assert store.catching_up(KEY) is None
    assert api.job["status"]["phase"] == "Running"

    api.exit("tj-worker-1", 1)
    watch.everything()
    _reconcile(cached, clock)
    assert api.job["status"]["restarts"] == 1
    # The cache still shows the failed pod and the old status: planning from it now would
    # judge the same failure again. The expectations hold the loop until both are shown.
    assert store.catching_up(KEY) is not None
    watch.job()
    assert store.catching_up(KEY) is not None, "the deleted pods are still in the cache"
    watch.pods()
    assert store.catching_up(KEY) is None
    _reconcile(cached, clock)
    assert api.job["status"]["restarts"] == 1


def test_when_the_watch_never_catches_up_the_next_reconcile_reads_the_api_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, store, cached, _, ticks = _setup(deadline_s=10.0)
    clock = Clock()
    _reconcile(cached, clock)
    ticks.now += 9.0
    assert store.catching_up(KEY) == pytest.approx(1.0)
    assert not caplog.records
    ticks.now += 1.5
    with caplog.at_level(logging.WARNING, "torchjob_operator"):
        assert store.catching_up(KEY) is None  # ran out
    # Said, with what was not seen: a decision waited 10 s for it.
    (said,) = [r.getMessage() for r in caplog.records]
    assert "did not show our writes within 10 s (pod tj-worker-0 created" in said, said
    assert "status (" in said and "phase" in said, said
    api.calls.clear()
    _reconcile(cached, clock)
    assert api.reads == 2, "one GET of the job and one LIST of its pods, live"
    assert "create_pod" not in api.calls, "the live read showed the pods already made"
    _reconcile(cached, clock)
    assert api.reads == 2, "only one reconcile pays for the live read"


def _realistic_pods() -> list[dict[str, Any]]:
    kube = FakeKube(_spec(4))
    clock = Clock()
    reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)
    kube.run_all()
    kube.exit("tj-worker-1", 137)
    pods = [copy.deepcopy(p) for p in kube.pods.values()]
    for p in pods:
        p["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    # A replacement that took 17 s from its creation to Ready (the replacement lead reads it).
    pods[3]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"
    pods[3]["metadata"]["labels"][contract.LABEL_JOINER] = "true"
    pods[3]["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:18Z"}
    ]
    pods[2]["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    )
    # Placed in a topology domain, and created to avoid two nodes for their state.
    pods[0]["metadata"]["labels"][DOMAIN_LABEL] = "d41d8cd9"
    pods[0]["metadata"]["annotations"] = {AVOIDED_NODES: "node-2,node-3", "other": "x"}
    # The killed worker says the OOM killer did it; a copy says it failed for a peer.
    killed = pods[1]["status"]["containerStatuses"][0]["state"]["terminated"]
    killed["message"] = termination_message("rank 1 killed", oom=True)
    peer = copy.deepcopy(pods[1])
    peer["metadata"]["name"] = "tj-worker-9"
    peer["metadata"]["labels"][contract.LABEL_POD_INDEX] = "9"
    gone = peer["status"]["containerStatuses"][0]["state"]["terminated"]
    gone["exitCode"] = 1
    gone["message"] = termination_message("rank 0 is gone", peer_failure=True)
    probe = copy.deepcopy(pods[2])
    probe["metadata"]["labels"][contract.LABEL_ROLE] = contract.ROLE_PROBE
    pulling = copy.deepcopy(pods[2])
    pulling["metadata"]["labels"]["app.kubernetes.io/name"] = "theirs"
    pulling["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "Initialized", "status": "True", "lastProbeTime": None},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t"},
        ],
        "initContainerStatuses": [{"name": "init", "state": {"running": {"startedAt": "t"}}}],
        "containerStatuses": [
            {
                "name": "trainer",
                "image": "img",
                "ready": False,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}},
                "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": "x"}},
            }
        ],
    }
    unschedulable = copy.deepcopy(pods[2])
    del unschedulable["spec"]["nodeName"]
    unschedulable["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                "lastTransitionTime": "2026-01-01T00:00:03Z",
            }
        ],
    }
    return [*pods, peer, probe, pulling, unschedulable]


def test_a_trimmed_pod_tells_the_planner_exactly_what_the_whole_pod_does() -> None:
    owners = set()
    pods = _realistic_pods()
    # The replacement's start survives the trim (it did not: the measured lead never worked,
    # bench/results/2026-12-01r notice120-0 made every replacement at the notice).
    seen = [pod_view(trim_pod(p)) for p in pods]
    assert [v.start_s for v in seen if v is not None and v.joiner] == [17.0]
    for pod in pods:
        trimmed = trim_pod(pod)
        assert pod_view(trimmed) == pod_view(pod)
        assert probe_view(trimmed) == probe_view(pod)
        # split_by_owner reads the controller's uid: a recreated job's pods must keep it.
        assert controller_uid(trimmed) == controller_uid(pod)
        owners.add(controller_uid(pod))
        assert "managedFields" not in trimmed["metadata"]
        assert "containers" not in trimmed["spec"]
        assert trim_pod(trimmed) == trimmed
    assert owners - {None}, "the realistic pods carry a controller ownerReference"


FROM_ELSEWHERE = {"silent", "notice", "notice_until", "node_lost"}
"""The PodView fields the planner fills from the job's status and the Nodes, never the pod."""


def test_every_field_the_planner_reads_from_a_pod_is_told_through_the_trim() -> None:
    """Each PodView field read from a pod differs from its default in some realistic pod seen
    through the trim: a field the trim dropped reads as its default everywhere, and fails here
    (``start_s`` did, so the measured replacement lead never worked). A new field needs a
    realistic pod that tells it, or a place in FROM_ELSEWHERE."""
    views = [v for v in (pod_view(trim_pod(p)) for p in _realistic_pods()) if v is not None]

    def default(f: dataclasses.Field[Any]) -> Any:
        if f.default is not dataclasses.MISSING:
            return f.default
        return None if f.default_factory is dataclasses.MISSING else f.default_factory()

    untold = {
        f.name
        for f in dataclasses.fields(PodView)
        if all(getattr(v, f.name) == default(f) for v in views)
    }
    assert sorted(untold - FROM_ELSEWHERE) == [], "read from a pod, lost in the trim or untested"
    assert sorted(FROM_ELSEWHERE - untold) == [], "now read from the pod: leave FROM_ELSEWHERE"


@pytest.mark.parametrize(
    ("current", "patch", "applied"),
    [
        ({"phase": "Running", "restarts": 1}, {"phase": "Running"}, True),
        ({"phase": "Pending"}, {"phase": "Running"}, False),
        ({"phase": "Running"}, {"restartAfter": None}, True),
        ({"restartAfter": "t"}, {"restartAfter": None}, False),
        ({"lastFailure": {"code": 1, "pod": "p"}}, {"lastFailure": {"code": 1}}, True),
        ({"lastFailure": {"code": 2}}, {"lastFailure": {"code": 1}}, False),
        ({"lastFailure": "x"}, {"lastFailure": {"code": 1}}, False),
        ({"conditions": [{"type": "Ready"}]}, {"conditions": [{"type": "Ready"}]}, True),
        (
            {"conditions": [{"type": "Ready"}, {"type": "X"}]},
            {"conditions": [{"type": "Ready"}]},
            False,
        ),
        (None, {"phase": None}, True),
        (None, {"phase": "Running"}, False),
    ],
)
def test_merge_applied_follows_rfc7386(
    current: dict[str, Any] | None, patch: dict[str, Any], applied: bool
) -> None:
    assert merge_applied(current, patch) is applied


def _pod(name: str, job: str = "tj", ns: str = "ns", **meta: Any) -> dict[str, Any]:
    labels = {contract.LABEL_JOB_NAME: job}
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, **meta}, "status": {}}


def test_pods_are_unknown_until_their_namespace_is_listed_then_follow_the_watch() -> None:
    store = Store()
    assert store.pods_of(KEY) is None
    changed = store.replace_pods("ns", [_pod("a"), _pod("b", job="other")])
    assert changed == {("ns", "tj"), ("ns", "other")}
    assert [p["metadata"]["name"] for p in store.pods_of(KEY) or []] == ["a"]
    assert store.pods_of(("elsewhere", "tj")) is None, "that namespace was never listed"
    store.put_pod(_pod("c"))
    store.put_pod(_pod("0"))
    store.drop_pod(_pod("a"))
    assert [p["metadata"]["name"] for p in store.pods_of(KEY) or []] == ["0", "c"], "by name"
    assert store.job_of_pod("ns", "c") == KEY and store.job_of_pod("ns", "a") is None
    store.drop_pod(_pod("0"))
    # A relist replaces what the scope held: "c" vanished while the watch was down.
    assert store.replace_pods(ALL_NAMESPACES, []) == {("ns", "tj"), ("ns", "other")}
    assert store.pods_of(KEY) == [] and store.pods_of(("elsewhere", "tj")) == []
    assert store.sizes() == (0, 0, 0)


def test_pod_expectations() -> None:
    pod = _pod("a")
    assert PodExpectation("a", "created").met(pod)
    assert not PodExpectation("a", "created").met(None)
    assert PodExpectation("a", "deleted").met(None)
    assert not PodExpectation("a", "deleted").met(pod)
    assert PodExpectation("a", "deleted").met(_pod("a", deletionTimestamp="t"))
    relabelled = _pod("a")
    relabelled["metadata"]["labels"][contract.LABEL_GENERATION] = "2"
    want = {contract.LABEL_GENERATION: "2"}
    assert PodExpectation("a", "labelled", want).met(relabelled)
    assert not PodExpectation("a", "labelled", want).met(pod)
    assert PodExpectation("a", "labelled", want).met(None), "a pod that is gone shows no lie"


def test_a_created_pod_is_not_mistaken_for_the_same_named_pod_of_the_last_generation() -> None:
    """Generation 1's worker-0 was created; the watch has not yet brought the DELETED of
    generation 0's worker-0 (terminating) nor the ADDED of ours. Planning from that cache
    would delete our new pod by name (a spurious disruption, seen in CI)."""
    gen = contract.LABEL_GENERATION
    created = PodExpectation("a", "created", {gen: "1"})
    old = _pod("a", deletionTimestamp="t")
    old["metadata"]["labels"][gen] = "0"
    assert not created.met(old)
    assert not created.met(None)
    ours = _pod("a")
    ours["metadata"]["labels"][gen] = "1"
    assert created.met(ours)


def test_a_created_pod_deleted_before_the_next_plan_meets_its_expectation() -> None:
    """A worker created and deleted at once (a loss of a job still Pending): the watch
    brings its DELETED, and the job plans at once instead of waiting out the cache deadline
    (about 10 s late in bench/topology_admission.py)."""
    gen = contract.LABEL_GENERATION
    store = Store(deadline_s=60.0)
    store.replace_pods("ns", [])
    store.expect_pods(KEY, [PodExpectation("a", "created", {gen: "1"})])
    assert store.catching_up(KEY) is not None, "nothing of it seen yet"
    earlier = _pod("a")
    earlier["metadata"]["labels"][gen] = "0"
    store.drop_pod(earlier)  # the last generation's pod of that name: not ours
    assert store.catching_up(KEY) is not None
    ours = _pod("a")
    ours["metadata"]["labels"][gen] = "1"
    store.drop_pod(ours)
    assert store.catching_up(KEY) is None


def test_a_deleted_job_leaves_nothing_behind() -> None:
    _, store, cached, _, _ = _setup()
    _reconcile(cached, Clock())
    assert store.awaiting(KEY)
    store.drop_job(KEY)
    assert not store.awaiting(KEY)
    assert store.job(KEY) is None
    assert store.sizes()[0] == 0 and store.sizes()[2] == 0


def test_a_deleted_job_is_gone_without_asking_until_its_tombstone_expires() -> None:
    api, store, cached, _, ticks = _setup()
    store.drop_job(KEY)
    assert cached.get_job("ns", "tj") is None, "the pods' last events poke a job known gone"
    assert api.reads == 0
    ticks.now += TOMBSTONE_S
    assert cached.get_job("ns", "tj") is not None and api.reads == 1, "then it asks"
    store.drop_job(KEY)
    store.put_job(api.job)  # created again under the same name
    assert not store.is_gone(KEY)
    store.drop_job(("ns", "other"))
    ticks.now += TOMBSTONE_S
    store.drop_job(("ns", "third"))
    assert not store.is_gone(("ns", "other")) and store.is_gone(("ns", "third"))
    assert list(store._gone) == [("ns", "third")], "expired tombstones are pruned"


def test_a_job_deleted_behind_the_watch_is_dropped_when_a_write_finds_it_gone() -> None:
    """kopf lists again after a watch's 410 Gone and reports no deletion in between: the
    cache may hold a job the API server no longer has. Its first status write (404) drops it,
    and the loop ends at the next reconcile instead of planning a ghost forever."""
    api, store, cached, _, _ = _setup()
    deleted: list[str] = []

    def gone(namespace: str, name: str, status: Any) -> bool:
        deleted.append(name)
        return False  # the API server answers 404

    api.patch_job_status = gone  # type: ignore[method-assign]
    api.get_job = lambda namespace, name: None  # type: ignore[method-assign]
    assert not reconcile_once(cached, "ns", "tj", settings=OperatorSettings(), clock=Clock()).gone
    assert deleted == ["tj"], "the ghost was planned from the cache and its write found it gone"
    assert store.job(KEY) is None and not store.awaiting(KEY)
    assert reconcile_once(cached, "ns", "tj", settings=OperatorSettings(), clock=Clock()).gone


def test_a_list_drops_the_jobs_it_no_longer_shows_but_not_those_newer_than_it() -> None:
    ticks = Ticks()
    store = Store(clock=ticks)
    for name in ("kept", "ghost"):
        store.put_job({"metadata": {"namespace": "ns", "name": name}})
    ticks.now += 1
    started = ticks()
    ticks.now += 1
    store.put_job({"metadata": {"namespace": "ns", "name": "new"}})  # after the LIST began
    assert store.sweep([("ns", "kept")], started) == [("ns", "ghost")]
    assert store.job(("ns", "ghost")) is None and store.is_gone(("ns", "ghost"))
    assert store.job(("ns", "kept")) is not None and store.job(("ns", "new")) is not None
    assert store.sweep([("ns", "kept"), ("ns", "new")], ticks()) == []


def test_the_operator_forgets_a_job_deleted_without_a_watch_event() -> None:
    from torchjob_operator.operator import Operator

    api = FakeKube(_spec())
    api.list_jobs = lambda namespaces: []  # type: ignore[method-assign]

    async def scenario() -> tuple[list[tuple[str, str]], bool]:
        op = Operator(OperatorSettings(), live=api)
        op.store.put_job(copy.deepcopy(api.job))
        op.jobs.poke(KEY)  # its loop runs (and reads the ghost from the cache)
        dropped = await op.sweep_jobs()
        return dropped, KEY in op.jobs.loops

    dropped, looping = asyncio.run(scenario())
    assert dropped == [KEY] and not looping


def test_a_silent_report_wakes_its_job_and_other_status_writes_do_not() -> None:
    """A status-only write nobody waits for (the operator's own, a worker's progress) does not
    run another reconcile; the survivors' silent-peer reports do, at once: left to the next
    pod event or requeue, they delayed the next generation by up to 8 s on the fleet bench."""
    from torchjob_operator.operator import Operator

    job = copy.deepcopy(FakeKube(_spec()).job)
    job["metadata"]["generation"] = 1
    job["status"] = {"observedGeneration": 1, "generation": 0}
    progress = copy.deepcopy(job)
    progress["status"]["progress"] = {"step": 10}
    report = copy.deepcopy(progress)
    report["status"]["silentWorkers"] = [{"pod": "tj-worker-1", "by": "tj-worker-0"}]

    async def scenario() -> list[str]:
        op = Operator(OperatorSettings(), live=FakeKube(_spec()))
        op.store.put_job(job)
        woke: list[str] = []
        # The job has a loop (a stand-in: nothing runs it). The queue's gauges read every
        # loop of every operator built in this process, so it leaves with the scenario.
        op.jobs.loops[KEY] = object()  # type: ignore[assignment]
        op.jobs.poke = lambda key: woke.append(key[1])  # type: ignore[method-assign]
        try:
            for what, body in (("progress", progress), ("report", report), ("again", report)):
                op.torchjob_event({"type": "MODIFIED", "object": body}, "ns", "tj")
                woke.append(f"after {what}")
        finally:
            del op.jobs.loops[KEY]
        return woke

    assert asyncio.run(scenario()) == ["after progress", "tj", "after report", "after again"]
