"""``spec.initializers``: the pure decision (``torchjob/initializers.py``), the manifests, the
spec's checks, and the order of one job through ``reconcile_once`` over the in-memory Kube
(no worker pod before every initialiser succeeded; a failure ends the job; a new generation
never runs one again). The real API server: tests/cluster/test_initializers.py; the real
fetch: tests/unit/test_initialize_s3.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from tests.unit.test_reconcile import Clock, FakeKube, _reconcile

from torchjob import contract
from torchjob.api.models import TorchJobSpec
from torchjob.rules import initializer as rules
from torchjob_operator.resources.initializers import initializer_pod
from torchjob_operator.resources.pods import worker_pod
from torchjob_operator.torchjob.initializers import (
    InitPod,
    Stage,
    decide_initializers,
    init_pod_view,
    size,
)
from torchjob_operator.torchjob.observed import PodPhase
from torchjob_operator.torchjob.status import validation_message

DATA, MODEL = "s3://data/sets/digits", "pvc://models/bert"


def _spec(**init: Any) -> dict[str, Any]:
    return {
        "replicas": 2,
        "failurePolicy": {"maxRestarts": 3, "backoff": {"initialSeconds": 5, "maxSeconds": 5}},
        "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
        "initializers": {
            "volume": {"claimName": "train-data"},
            "dataset": {"uri": DATA, "secretName": "store"},
            "model": {"uri": MODEL},
            **init,
        },
    }


SPEC = TorchJobSpec.model_validate(_spec())
OK_LINE = rules.summary(3 << 20, 2, DATA)


# --- the decision ---------------------------------------------------------------------------


def test_without_pods_both_are_created_and_nothing_is_done() -> None:
    g = decide_initializers(SPEC, {}, [])
    assert g is not None and g.create == ("dataset", "model") and not g.done
    assert [r.stage for r in g.records] == [Stage.PENDING, Stage.PENDING]
    assert (
        decide_initializers(TorchJobSpec.model_validate({**_spec(), "initializers": None}), {}, [])
        is None
    )


def test_each_pod_says_where_its_initializer_is() -> None:
    pods = [
        InitPod("dataset", "tj-init-dataset", PodPhase.SUCCEEDED, 0, OK_LINE, finished_at="t1"),
        InitPod("model", "tj-init-model", PodPhase.RUNNING),
    ]
    g = decide_initializers(SPEC, {}, pods)
    assert g is not None and g.create == () and not g.done and g.failed is None
    data, model = g.records
    assert (data.stage, data.bytes, data.completion_time) == (Stage.SUCCEEDED, 3 << 20, "t1")
    assert model.stage == Stage.RUNNING
    assert [e.reason for e in g.events] == ["InitializerSucceeded"]
    assert "3.0 MiB" in g.events[0].message and DATA in g.events[0].message
    assert g.progress() == "dataset Succeeded (3.0 MiB), model Running"


def test_a_recorded_success_is_final_and_a_new_uri_runs_again() -> None:
    status = {
        "initializers": decide_initializers(SPEC, {}, [_done("dataset"), _done("model")]).status()
    }  # type: ignore[union-attr]
    again = decide_initializers(SPEC, status, [])
    assert again is not None and again.done and again.create == () and again.events == ()
    moved = TorchJobSpec.model_validate(_spec(dataset={"uri": "s3://data/sets/other"}))
    changed = decide_initializers(moved, status, [])
    assert changed is not None and changed.create == ("dataset",) and not changed.done


def test_a_failed_pod_fails_its_initializer_with_its_message() -> None:
    bad = "cannot read s3://data/sets/digits: access to bucket 'data' denied"
    g = decide_initializers(
        SPEC, {}, [InitPod("dataset", "tj-init-dataset", PodPhase.FAILED, 1, bad)]
    )
    assert g is not None and g.failed is not None and g.failed.message == bad
    mute = decide_initializers(
        SPEC, {}, [InitPod("dataset", "tj-init-dataset", PodPhase.FAILED, 3)]
    )
    assert mute is not None and mute.failed is not None and mute.failed.message == "exit code 3"


def test_an_evicted_pod_is_replaced_and_one_that_cannot_start_waits() -> None:
    evicted = InitPod("dataset", "tj-init-dataset", PodPhase.FAILED, None, disrupted=True)
    stuck = InitPod("model", "tj-init-model", waiting="CreateContainerConfigError",
                    waiting_message='secret "store" not found')  # fmt: skip
    g = decide_initializers(SPEC, {}, [evicted, stuck])
    assert g is not None and g.failed is None and g.delete == ("tj-init-dataset",)
    assert 'model Pending: CreateContainerConfigError: secret "store" not found' in g.progress()


def test_sizes_read_like_a_person_writes_them() -> None:
    assert [size(n) for n in (512, 1536, 1 << 30)] == ["512 B", "1.5 KiB", "1.0 GiB"]
    assert rules.fetched_bytes(rules.summary(7, 1, DATA, cached=True)) == 7
    assert rules.fetched_bytes("Traceback ...") is None


def _done(kind: str) -> InitPod:
    return InitPod(kind, f"tj-init-{kind}", PodPhase.SUCCEEDED, 0, rules.summary(10, 1, "x"))


# --- the spec and the manifests --------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"dataset": {"uri": "ftp://host/x"}}, "spec.initializers.dataset.uri"),
        ({"model": {"uri": "hf://only-an-org"}}, "spec.initializers.model.uri"),
        ({"volume": {"claimName": "Bad_Name"}}, "spec.initializers.volume.claimName"),
        ({"volume": {"claimName": "c", "mountPath": "/dev/shm"}}, "volume.mountPath"),
        ({"dataset": {"uri": DATA, "secretName": "UPPER"}}, "dataset.secretName"),
        ({"dataset": None, "model": None}, "needs a dataset or a model"),
    ],
)
def test_a_bad_initializer_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        TorchJobSpec.model_validate(_spec(**change))
    assert field in validation_message(err.value)


def test_the_initializer_pod_runs_the_cli_on_the_volume_with_the_secret() -> None:
    pod = initializer_pod(name="tj", namespace="ns", uid="u1", spec=SPEC, kind="dataset")
    c = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "tj-init-dataset"
    assert pod["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_INITIALIZER
    assert pod["spec"]["restartPolicy"] == "Never" and c["image"] == "img"
    target = "/torchjob/initializers/dataset"
    assert c["command"] == ["torchjob", "initialize", "--uri", DATA, "--target", target]
    assert c["envFrom"] == [{"secretRef": {"name": "store"}}]
    assert "nvidia.com/gpu" not in str(c["resources"])
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]]
    assert claims == ["train-data"]
    model = initializer_pod(name="tj", namespace="ns", uid="u1", spec=SPEC, kind="model")
    source = model["spec"]["volumes"][1]["persistentVolumeClaim"]
    assert source == {"claimName": "models", "readOnly": True}


def test_every_worker_mounts_the_volume_and_sees_the_paths() -> None:
    pod = worker_pod(
        name="tj", namespace="ns", uid="u1", spec=SPEC, index=1, generation=0, replicas=2
    )
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[contract.DATASET_PATH] == "/torchjob/initializers/dataset"
    assert env[contract.MODEL_PATH] == "/torchjob/initializers/model"
    assert {"name": "torchjob-initializers", "mountPath": "/torchjob/initializers",
            "readOnly": True} in c["volumeMounts"]  # fmt: skip


# --- the order, through reconcile_once ---------------------------------------------------------


def _finish(kube: FakeKube, name: str, code: int, message: str) -> None:
    kube.pods[name]["status"] = {
        "phase": "Failed" if code else "Succeeded",
        "containerStatuses": [
            {
                "name": "initializer",
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "message": contract.termination_message(message),
                        "finishedAt": "2026-01-01T00:00:03Z",
                    }
                },
            }
        ],
    }


def _workers(kube: FakeKube) -> list[str]:
    return sorted(n for n in kube.pods if "-worker-" in n)


def test_workers_start_only_after_every_initializer_and_never_run_them_again() -> None:
    kube, clock = FakeKube(_spec()), Clock()
    _reconcile(kube, clock)
    _reconcile(kube, clock)  # a second pass creates nothing more
    assert sorted(kube.pods) == ["tj-init-dataset", "tj-init-model"]
    status = kube.job["status"]
    assert status["phase"] == "Pending"
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Ready"] == ["Initializing"]
    assert [i["phase"] for i in status["initializers"]] == ["Pending", "Pending"]
    assert [r for r, _ in kube.events].count("CreatedInitializer") == 2

    _finish(kube, "tj-init-dataset", 0, OK_LINE)
    _reconcile(kube, clock)
    assert _workers(kube) == []  # the model is not there yet
    _finish(kube, "tj-init-model", 0, rules.summary(5, 1, MODEL))
    _reconcile(kube, clock)
    assert _workers(kube) == ["tj-worker-0", "tj-worker-1"]
    recorded = {i["name"]: i for i in kube.job["status"]["initializers"]}
    assert recorded["dataset"]["bytes"] == 3 << 20 and recorded["model"]["phase"] == "Succeeded"
    assert [r for r, _ in kube.events].count("InitializerSucceeded") == 2

    # A failure: generation 1 starts, and no initialiser runs again, even with its pod gone.
    del kube.pods["tj-init-dataset"], kube.pods["tj-init-model"]
    kube.run_all()
    _reconcile(kube, clock)
    kube.exit("tj-worker-1", 1)
    for _ in range(4):
        _reconcile(kube, clock)
        kube.run_all()
        clock.now += timedelta(seconds=6)
    assert kube.job["status"]["currentGeneration"] == 1 and kube.job["status"]["restarts"] == 1
    assert not any("-init-" in n for n in kube.pods)
    assert _workers(kube) == ["tj-worker-0", "tj-worker-1"]


def test_a_failed_initializer_fails_the_job_naming_its_uri_and_creates_no_worker() -> None:
    kube, clock = FakeKube(_spec()), Clock()
    _reconcile(kube, clock)
    bad = "cannot list s3://data/sets/digits: access to bucket 'data' denied (check AWS_*)"
    _finish(kube, "tj-init-dataset", 1, bad)
    _reconcile(kube, clock)
    _reconcile(kube, clock)
    status = kube.job["status"]
    assert status["phase"] == "Failed" and _workers(kube) == []
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InitializerFailed"
    assert DATA in failed["message"] and "bucket 'data'" in failed["message"]
    warnings = [m for r, m in kube.events if r == "InitializerFailed"]
    assert len(warnings) == 1 and DATA in warnings[0]


def test_the_runtime_gives_the_paths_to_the_training_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchjob.train import get_context

    assert get_context().get_dataset_path() is None and get_context().get_model_path() is None
    monkeypatch.setenv(contract.DATASET_PATH, "/torchjob/initializers/dataset")
    monkeypatch.setenv(contract.MODEL_PATH, "/torchjob/initializers/model")
    assert get_context().get_dataset_path() == "/torchjob/initializers/dataset"
    assert get_context().get_model_path() == "/torchjob/initializers/model"


def test_the_manifest_of_docs_platform_md_is_valid_as_written() -> None:
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "platform.md").read_text()
    section = text.split("## Initialisers", 1)[1].split("\n## ", 1)[0]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    claim, job = list(yaml.safe_load_all(block))
    spec = TorchJobSpec.model_validate(job["spec"])
    assert spec.initializers is not None
    assert spec.initializers.volume.claim_name == claim["metadata"]["name"]
    assert set(spec.initializers.sources()) == {"dataset", "model"}


def test_an_initializer_pod_that_cannot_be_placed_says_why() -> None:
    pod = initializer_pod(name="tj", namespace="ns", uid="u1", spec=SPEC, kind="dataset")
    why = 'persistentvolumeclaim "train-data" not found'
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
        ],
    }
    view = init_pod_view(pod)
    assert view is not None and (view.kind, view.waiting) == ("dataset", "Unschedulable")
    g = decide_initializers(SPEC, {}, [view])
    assert g is not None and f"dataset Pending: Unschedulable: {why}" in g.progress()
