"""Which job a pod watch event pokes (the watch itself runs in every cluster test)."""

from __future__ import annotations

from torchjob import contract
from torchjob_operator.engine.podwatch import job_of


def pod_event(kind: str, labels: dict[str, str] | None) -> dict[str, object]:
    meta = {"name": "p", "namespace": "ns", "resourceVersion": "5", "labels": labels}
    return {"type": kind, "object": {"metadata": meta}}


def test_a_pod_event_pokes_its_job_and_nothing_else_does() -> None:
    own = {contract.LABEL_JOB_NAME: "tj", contract.LABEL_POD_INDEX: "0"}
    assert job_of(pod_event("ADDED", own)) == ("ns", "tj")
    assert job_of(pod_event("DELETED", own)) == ("ns", "tj")
    assert job_of(pod_event("MODIFIED", {"app": "other"})) is None
    assert job_of(pod_event("MODIFIED", None)) is None
    assert job_of(pod_event("BOOKMARK", own)) is None


def test_a_workload_pokes_the_torchjob_that_controls_it_and_nothing_else() -> None:
    from torchjob_operator.engine.podwatch import owner_job

    def workload(*refs: dict[str, object]) -> dict[str, object]:
        return {"metadata": {"name": "w", "namespace": "ns", "ownerReferences": list(refs)}}

    job = {"kind": "TorchJob", "name": "tj", "controller": True}
    assert owner_job(workload(job)) == ("ns", "tj")
    assert owner_job(workload({**job, "controller": False})) is None  # not its controller
    assert owner_job(workload({"kind": "Job", "name": "j", "controller": True})) is None
    assert owner_job({"metadata": {"name": "w"}}) is None
