"""A job with spec.runtimeRef through ``reconcile_once`` over the in-memory Kube: it waits
for a missing blueprint (a condition, an Event, a retry), resolves it once, pins it in
status.runtime before any pod, and keeps it when the blueprint is edited or deleted."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.test_reconcile import Clock, FakeKube, _settle

from torchjob_operator.engine.settings import OperatorSettings
from torchjob_operator.torchjob import blueprint
from torchjob_operator.torchjob.controller import reconcile_once

KIND = "ClusterTorchRuntime"


def _blueprint(image: str = "rt:1", version: str = "7") -> dict[str, Any]:
    return {
        "metadata": {"name": "cpu", "resourceVersion": version, "generation": 1},
        "spec": {
            "nprocPerNode": 2,
            "failurePolicy": {"maxRestarts": 3, "backoff": {"initialSeconds": 5, "maxSeconds": 5}},
            "template": {
                "spec": {
                    "containers": [
                        {"name": "trainer", "image": image, "env": [{"name": "A", "value": "1"}]}
                    ]
                }
            },
        },
    }


def _job() -> FakeKube:
    return FakeKube(
        {
            "runtimeRef": {"name": "cpu"},
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "trainer", "command": ["train"]}]}},
        }
    )


def _condition(kube: FakeKube, type_: str) -> dict[str, Any]:
    return next(c for c in kube.job["status"]["conditions"] if c["type"] == type_)


def _images(kube: FakeKube) -> set[str]:
    return {p["spec"]["containers"][0]["image"] for p in kube.pods.values()}


def test_a_missing_blueprint_is_a_condition_and_the_job_starts_once_it_exists() -> None:
    kube, clock = _job(), Clock()
    result = reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)
    assert result.requeue_after_s == blueprint.RETRY_S and not kube.pods
    ready = _condition(kube, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RuntimeNotFound")
    assert "ClusterTorchRuntime cpu, which does not exist" in ready["message"]
    assert _condition(kube, "Stalled")["status"] == "False"  # it waits; nothing to fix in it
    assert [r for r, _ in kube.events] == ["RuntimeNotFound"]

    kube.runtimes[(KIND, "cpu")] = _blueprint()
    _settle(kube, clock, passes=3)
    assert kube.job["status"]["phase"] == "Running"
    assert _condition(kube, "Stalled")["status"] == "False"
    pinned = kube.job["status"]["runtime"]
    assert (pinned["kind"], pinned["name"], pinned["resourceVersion"]) == (KIND, "cpu", "7")
    (pod, *_) = kube.pods.values()
    worker = pod["spec"]["containers"][0]
    assert worker["image"] == "rt:1" and worker["command"] == ["train"]
    assert {"name": "A", "value": "1"} in worker["env"]
    assert kube.job["status"]["worldSize"] == 4  # nprocPerNode 2 from the blueprint
    # pinned before the first pod, read once
    first_pod = kube.calls.index("create_pod")
    assert kube.calls.index("patch_job_status") < first_pod
    assert sum(c.startswith("get_runtime") for c in kube.calls) == 2  # missing, then found


def test_an_edited_or_deleted_blueprint_never_changes_a_running_job() -> None:
    kube, clock = _job(), Clock()
    kube.runtimes[(KIND, "cpu")] = _blueprint()
    _settle(kube, clock, passes=3)
    kube.runtimes[(KIND, "cpu")] = _blueprint(image="rt:2", version="8")
    kube.exit("tj-worker-1", 1)  # a new generation is created after the edit
    _settle(kube, clock, passes=4)
    assert kube.job["status"]["currentGeneration"] == 1 and _images(kube) == {"rt:1"}
    del kube.runtimes[(KIND, "cpu")]
    kube.exit("tj-worker-0", 1)
    _settle(kube, clock, passes=4)
    assert kube.job["status"]["currentGeneration"] == 2 and _images(kube) == {"rt:1"}
    assert kube.job["status"]["runtime"]["resourceVersion"] == "7"
    assert sum(c.startswith("get_runtime") for c in kube.calls) == 1


def test_an_invalid_merge_is_stalled_with_the_field_and_the_side() -> None:
    kube, clock = _job(), Clock()
    bad = _blueprint()
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    kube.runtimes[(KIND, "cpu")] = bad
    result = reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)
    assert result.requeue_after_s is None and not kube.pods
    ready = _condition(kube, "Ready")
    assert ready["reason"] == "InvalidRuntimeMerge"
    assert "spec.template.spec.restartPolicy: " in ready["message"]
    assert "restartPolicy must be Never" in ready["message"]
    assert "(from ClusterTorchRuntime cpu)" in ready["message"]
    assert _condition(kube, "Stalled")["status"] == "True"
    assert "runtime" not in kube.job["status"]


def test_no_write_comes_before_the_plan_a_job_that_cannot_be_built_pins_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pin is a write the plan orders first (``writes.First``), not a write before the
    plan: a job whose pods cannot be built is reported as such, and its status never says it
    keeps a blueprint that no pod was built from."""
    from torchjob_operator.torchjob import writes

    def broken(**_: Any) -> dict[str, Any]:
        raise OverflowError("something no rule foresaw")

    monkeypatch.setattr(writes, "worker_pod", broken)
    kube, clock = _job(), Clock()
    kube.runtimes[(KIND, "cpu")] = _blueprint()
    reconcile_once(kube, "ns", "tj", settings=OperatorSettings(), clock=clock)
    assert "runtime" not in kube.job["status"]
    assert [r for r, _ in kube.events] == ["InvalidSpec"]
    assert [c for c in kube.calls if not c.startswith("get_")] == [
        "patch_job_status",
        "event:InvalidSpec",
    ]
