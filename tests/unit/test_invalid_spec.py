"""What the operator writes for a TorchJob whose spec slipped past the CRD's validation."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from torchjob.api import TorchJobSpec
from torchjob_operator import reconcile
from torchjob_operator.reconcile import _invalid_status, validation_message
from torchjob_operator.settings import OperatorSettings


def test_validation_message_names_fields_in_wire_form() -> None:
    with pytest.raises(ValidationError) as err:
        TorchJobSpec.model_validate({"replicas": 0, "template": {"spec": {"containers": []}}})
    text = validation_message(err.value)
    assert "spec.replicas:" in text
    assert "spec.template.spec.containers:" in text


def test_invalid_spec_sets_ready_false_and_stalled_true_once() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    job = {"metadata": {"generation": 4}, "status": {}}
    status = _invalid_status(
        job, "TorchJob ns/x has an invalid spec: spec.replicas: too small", now
    )
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["reason"] == "InvalidSpec"
    assert by_type["Stalled"]["status"] == "True"
    assert "spec.replicas" in by_type["Stalled"]["message"]
    assert status["observedGeneration"] == 4
    # The same error an hour later changes nothing, so no status write and no repeated Event.
    later = _invalid_status(
        {**job, "status": status}, by_type["Stalled"]["message"], now.replace(hour=1)
    )
    assert later == status


class _RecordingKube:
    """Just enough of torchjob_operator.kube.Kube to watch what one reconcile writes."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.status_patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.created: list[dict[str, Any]] = []

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.job

    def list_worker_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return []

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status_patches.append(status)
        self.job = {**self.job, "status": {**(self.job.get("status") or {}), **status}}

    def post_event(
        self, job: Any, *, type_: str, reason: str, message: str, component: str
    ) -> None:
        self.events.append((type_, reason, message))

    def create_pod(self, body: dict[str, Any]) -> bool:  # pragma: no cover - must not happen
        self.created.append(body)
        return True

    def ensure_service(self, body: dict[str, Any]) -> bool:  # pragma: no cover
        return False

    def ensure_rbac_object(self, kind: str, body: dict[str, Any]) -> bool:  # pragma: no cover
        return False


def test_an_error_while_building_pods_is_invalid_spec_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any exception judging or building a job's objects: Stalled/InvalidSpec and one Warning
    Event on the first reconcile, no pod, no requeue; the next reconcile writes nothing."""

    def broken(**_: Any) -> dict[str, Any]:
        raise OverflowError("something no rule foresaw")

    monkeypatch.setattr(reconcile, "worker_pod", broken)
    job = {
        "metadata": {"name": "x", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
        },
    }
    kube = _RecordingKube(job)
    settings = OperatorSettings()
    outcome = reconcile.reconcile_once(kube, "ns", "x", settings=settings)  # type: ignore[arg-type]
    assert outcome.requeue_after_s is None and not outcome.gone
    assert kube.created == []
    (status,) = kube.status_patches
    stalled = {c["type"]: c for c in status["conditions"]}["Stalled"]
    assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec"
    assert "OverflowError: something no rule foresaw" in stalled["message"]
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "InvalidSpec")]
    reconcile.reconcile_once(kube, "ns", "x", settings=settings)  # type: ignore[arg-type]
    assert len(kube.status_patches) == 1 and len(kube.events) == 1
