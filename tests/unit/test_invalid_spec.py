"""What the operator writes for a TorchJob whose spec slipped past the CRD's validation.

The reconcile itself (first pass, once, no pods) is tested over the in-memory Kube in
tests/unit/test_reconcile.py."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from torchjob.api import TorchJobSpec
from torchjob_operator.torchjob.status import invalid_status as _invalid_status
from torchjob_operator.torchjob.status import validation_message


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
