"""spec.managedBy (torchjob_operator.torchjob.managed) and MultiKueue's prebuilt Workload on a
worker cluster (admission.sync). The real operator and real Kueue: tests/cluster/test_multikueue.py."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.api.models import TorchJobSpec
from torchjob_operator.torchjob import admission, kueue, managed
from torchjob_operator.torchjob.managed import Role


def tj(managed_by: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": 1}
    if managed_by is not None:
        spec["managedBy"] = managed_by
    return {"metadata": {"name": "tj", "labels": labels or {}}, "spec": spec}


@pytest.mark.parametrize(
    ("by", "queued", "role"),
    [
        (None, False, Role.RUN),
        (None, True, Role.RUN),
        ("torchjob.io/operator", True, Role.RUN),
        ("kueue.x-k8s.io/multikueue", True, Role.QUEUE),
        # MultiKueue dispatches a Workload; without a queue there is none: nothing to do.
        ("kueue.x-k8s.io/multikueue", False, Role.NONE),
        ("example.com/other", True, Role.NONE),
        ("example.com/other", False, Role.NONE),
    ],
)
def test_role_of_the_managed_by(by: str | None, queued: bool, role: Role) -> None:
    assert managed.role_of(tj(by), queued) is role


def test_the_default_is_the_models() -> None:
    spec = TorchJobSpec.model_validate(
        {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    )
    assert spec.managed_by == managed.OURS == managed.managed_by(tj())


def test_the_prebuilt_workload_is_the_label() -> None:
    assert managed.prebuilt_workload(tj()) is None
    assert managed.prebuilt_workload(tj(labels={managed.PREBUILT_LABEL: "torchjob-x"})) == (
        "torchjob-x"
    )


def workload(owner: str | None, spec_hash: str = "h1", **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "torchjob-tj", "uid": "w1", "annotations": {}}
    meta["annotations"][kueue.SPEC_HASH] = spec_hash
    if owner is not None:
        meta["ownerReferences"] = [{"controller": True, "uid": owner}]
    return {"metadata": meta, "status": status}


ADMITTED = {
    "conditions": [
        {"type": t, "status": "True", "reason": "R", "message": "m"}
        for t in (kueue.QUOTA_RESERVED, kueue.ADMITTED)
    ],
    "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "workers"}]},
}


def seen(existing: dict[str, Any] | None, prebuilt: bool) -> admission.WorkloadSeen:
    return admission.WorkloadSeen(
        job="ns/tj",
        queue="lq",
        name="torchjob-tj",
        existing=existing,
        owned=existing is None or admission.owns(existing, "u1", prebuilt),
        desired=workload("u1", spec_hash="h2"),
        count=1,
        prebuilt=prebuilt,
    )


def test_a_prebuilt_workload_is_used_as_found_never_replaced() -> None:
    # MultiKueue's copy: no owner, made from the manager's pod set (another hash is possible).
    found = workload(None, **ADMITTED)
    step = admission.sync(seen(found, prebuilt=True), None)
    assert step.create is None and step.delete is None
    assert step.gate is not None and step.gate.admitted
    # The same Workload without the label is an earlier same-named job's: the job waits.
    step = admission.sync(seen(found, prebuilt=False), None)
    assert step.gate is not None and not step.gate.admitted and step.create is None
    # Our own stale Workload is replaced.
    step = admission.sync(seen(workload("u1"), prebuilt=False), None)
    assert step.delete == ("ns", "torchjob-tj", "w1")


def test_a_missing_prebuilt_workload_is_waited_for_not_made() -> None:
    step = admission.sync(seen(None, prebuilt=True), None)
    assert step.create is None and step.gate is not None and not step.gate.admitted
    assert admission.sync(seen(None, prebuilt=False), None).create is not None


def test_a_prebuilt_workload_another_job_owns_is_not_ours() -> None:
    assert not admission.owns(workload("someone"), "u1", prebuilt=True)
    assert admission.owns(workload(None), "u1", prebuilt=True)
    assert not admission.owns(workload(None), "u1", prebuilt=False)
