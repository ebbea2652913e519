"""Kueue admission decisions (planner/kueue.py and the planner's hold while not admitted)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.builders import at, job, pod, running
from tests.unit.test_planner import apply

from torchjob.api.models import Phase
from torchjob_operator.torchjob import kueue
from torchjob_operator.torchjob.plan import JobView, plan, with_state

WAITING = kueue.Gate(workload="torchjob-tj", queue="lq")
ADMITTED = kueue.Gate(admitted=True, holds_quota=True, workload="torchjob-tj", queue="lq")
EVICTED = kueue.Gate(
    evicted="Preempted: preempted by a higher priority workload",
    holds_quota=True,
    workload="torchjob-tj",
    queue="lq",
)


def gated(view: JobView, gate: kueue.Gate) -> JobView:
    return replace(view, kueue=gate)


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_queue_from_the_label_or_the_spec() -> None:
    assert kueue.queue_of({kueue.QUEUE_LABEL: "a"}, "b") == "a"
    assert kueue.queue_of({}, "b") == "b"
    assert kueue.queue_of({}, None, {kueue.QUEUE_LABEL: "c"}) == "c"
    assert kueue.queue_of({}, None) is None


def test_no_pod_before_the_admission_and_describe_says_why() -> None:
    decided = plan(gated(job().build(), WAITING), [], at(0))
    assert decided.create is None
    assert decided.phase == Phase.SUSPENDED
    assert ready(decided.status)["reason"] == "WaitingForAdmission"
    assert "LocalQueue lq" in ready(decided.status)["message"]


def test_an_admission_starts_the_job_and_an_eviction_is_a_disruption_never_a_restart() -> None:
    view = gated(job().build(), WAITING)
    decided = plan(view, [], at(0))
    view, pods = with_state(view, decided.status), []
    view = gated(view, ADMITTED)
    decided = plan(view, pods, at(1))
    assert decided.create is not None and decided.create.generation == 1
    pods = [running(p) for p in apply(decided, pods)]
    view = with_state(view, decided.status)

    evicted = plan(gated(view, EVICTED), pods, at(2))
    assert set(evicted.delete) == {p.name for p in pods}
    assert evicted.phase == Phase.SUSPENDED
    assert ready(evicted.status)["reason"] == "AdmissionEvicted"
    assert evicted.status["disruptions"] == 1
    assert evicted.status.get("restarts", 0) == 0
    assert any(e.reason == "AdmissionEvicted" and e.type == "Warning" for e in evicted.events)
    # Planned again while the pods stop: counted once.
    view = with_state(view, evicted.status)
    again = plan(gated(view, EVICTED), [], at(3))
    assert again.status["disruptions"] == 1

    resumed = plan(gated(view, ADMITTED), [], at(4))
    assert resumed.create is not None and resumed.create.generation == 2
    assert resumed.status.get("restarts", 0) == 0


def test_a_finished_job_is_not_held() -> None:
    done = job().with_status(phase="Succeeded").build()
    decided = plan(gated(done, WAITING), [pod(0)], at(0))
    assert decided.phase == Phase.SUCCEEDED


def workload(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "torchjob-tj", "resourceVersion": "7"}, "status": status}


def cond(type_: str, status: bool, reason: str = "R") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "f", "memory": "f"}}],
}


def test_gate_of_an_admitted_workload_carries_the_flavor_and_pod_set_updates() -> None:
    wl = workload(
        conditions=[cond("QuotaReserved", True), cond("Admitted", True)],
        admission=ADMISSION,
        admissionChecks=[
            {
                "name": "check",
                "podSetUpdates": [
                    {"name": "workers", "labels": {"l": "v"}, "nodeSelector": {"zone": "a"}}
                ],
            }
        ],
    )
    assert kueue.flavor_names(wl) == ("f",)
    toleration = {"key": "t", "operator": "Exists", "effect": "NoSchedule"}
    gate = kueue.gate_of(wl, {"f": {"nodeLabels": {"pool": "p"}, "tolerations": [toleration]}})
    assert gate.admitted and gate.holds_quota and gate.evicted is None
    pod_body: dict[str, Any] = {
        "metadata": {"labels": {kueue.QUEUE_LABEL: "lq"}},
        "spec": {"nodeSelector": {"pool": "mine", "x": "y"}},
    }
    kueue.apply_admission(pod_body, gate.assignment)
    assert pod_body["spec"]["nodeSelector"] == {"pool": "p", "x": "y", "zone": "a"}
    assert pod_body["spec"]["tolerations"] == [toleration]
    assert pod_body["metadata"]["labels"] == {"l": "v"}  # no queue-name: never queued per pod


def test_an_evicted_workload_is_not_admitted_and_its_quota_is_handed_back_once() -> None:
    wl = workload(
        conditions=[
            cond("QuotaReserved", True),
            cond("Admitted", True),
            cond("Evicted", True, "Preempted"),
        ],
        admission=ADMISSION,
    )
    gate = kueue.gate_of(wl, {})
    assert not gate.admitted and gate.evicted is not None and gate.evicted.startswith("Preempted")
    patch = kueue.release_patch(wl, "2026-01-01T00:01:00Z")
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "7"
    assert patch["status"]["admission"] is None
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["QuotaReserved"]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == "True"
    assert by_type["Evicted"]["status"] == "True"  # Kueue's, kept
    released = workload(conditions=patch["status"]["conditions"])
    assert kueue.release_patch(released, "2026-01-01T00:02:00Z") is None


def test_finish_patch_once() -> None:
    wl = workload(conditions=[cond("Admitted", True)])
    patch = kueue.finish_patch(wl, succeeded=False, message="TorchJob Failed", now="t")
    assert patch is not None
    finished = [c for c in patch["status"]["conditions"] if c["type"] == "Finished"]
    assert finished[0]["status"] == "True" and finished[0]["reason"] == "Failed"
    assert (
        kueue.finish_patch(workload(conditions=finished), succeeded=True, message="", now="t")
        is None
    )


def test_desired_workload_is_owned_and_a_changed_pod_set_makes_it_stale() -> None:
    worker = {
        "metadata": {"labels": {kueue.QUEUE_LABEL: "lq", "a": "b"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }

    def make(count: int, priority: str | None = None) -> dict[str, Any]:
        return kueue.desired_workload(
            name="tj",
            namespace="ns",
            uid="u1",
            queue="lq",
            count=count,
            worker=worker,
            priority_class=priority,
            priority=5 if priority else None,
        )

    wl = make(2)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["spec"]["queueName"] == "lq"
    pod_set = wl["spec"]["podSets"][0]
    assert pod_set["count"] == 2 and "minCount" not in pod_set
    assert pod_set["template"]["metadata"]["labels"] == {"a": "b"}
    assert kueue.owned_by(wl, "u1") and not kueue.owned_by(wl, "u2")
    assert kueue.matches(wl, make(2))
    assert not kueue.matches(wl, make(3))
    high = make(2, "high")
    assert high["spec"]["priorityClassRef"]["name"] == "high" and high["spec"]["priority"] == 5
    assert not kueue.matches(wl, high)
