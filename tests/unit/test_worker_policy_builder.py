"""The worker admission policy's builder: one source for the chart and the tests.

What the policy does is tested on the real API server (tests/cluster/test_worker_policy.py);
these pin what ties it to the rest of the code: the chart's file, the account name, the fields.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from torchjob import contract
from torchjob.api.models import TorchJobStatus
from torchjob_operator.resources.worker_policy import (
    WORKER_STATUS_FIELDS,
    chart_template,
    worker_pod_regex_tail,
    worker_policy,
)

CHART_FILE = (
    Path(__file__).resolve().parents[2]
    / "charts"
    / "torchjob-operator"
    / "templates"
    / "worker-policy.yaml"
)


def test_the_charts_policy_is_generated_from_the_builder() -> None:
    assert CHART_FILE.read_text() == chart_template(), "the chart is stale: run `make crds`"


def test_it_matches_exactly_the_account_the_operator_names_for_the_job() -> None:
    (condition,) = worker_policy()["spec"]["matchConditions"]
    account = condition["expression"].partition(" || ")[0]
    left, _, right = account.partition(" == ")
    assert left == "request.userInfo.username"
    # The right side concatenates string literals and two request fields: evaluate it.
    request = {"request.namespace": "team-a", "request.name": "resnet"}
    username = "".join(request.get(p) or json.loads(p) for p in right.split(" + "))
    account = contract.worker_service_account("resnet")
    assert username == f"system:serviceaccount:team-a:{account}"


def test_it_matches_a_token_bound_to_one_of_the_jobs_worker_pods_only() -> None:
    pattern = re.compile("^resnet" + worker_pod_regex_tail())
    (condition,) = worker_policy()["spec"]["matchConditions"]
    assert f'request.name + "{worker_pod_regex_tail()}"' in condition["expression"]
    assert pattern.match(contract.worker_pod_name("resnet", 12))
    for other in (
        contract.probe_pod_name("resnet", 0),
        contract.worker_pod_name("resnet-b", 0),
        contract.worker_pod_name("resnet", 0) + "x",
    ):
        assert not pattern.match(other), other


def test_the_workers_own_exactly_the_status_fields_the_operator_leaves_out() -> None:
    """``TorchJobStatus.to_patch`` leaves out what others write; of those, only the runtime
    blueprint's pin (``runtime``, the operator's, written once) is not the workers'. (The
    history and the loss counts are written only when there are some: here there are.)"""
    aliases = {f.alias or n for n, f in TorchJobStatus.model_fields.items()}
    record = {"generation": 1, "began": "2026-11-28T00:00:00Z", "cause": "kill"}
    full = TorchJobStatus.model_validate({"history": [record], "losses": {"kill": 1}})
    operators = set(full.to_patch())
    assert set(WORKER_STATUS_FIELDS) <= aliases
    assert aliases - operators == set(WORKER_STATUS_FIELDS) | {"runtime"}
