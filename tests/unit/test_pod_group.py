"""The PodGroup builders of spec.scheduling.gang (resources/pods.py), per scheduler."""

from __future__ import annotations

import pytest

from torchjob.api import TorchJobSpec
from torchjob.api.models import GangSpec
from torchjob_operator.resources.pods import gang_pod_metadata, pod_group, worker_pod


@pytest.mark.parametrize(
    ("gang", "api", "spec", "labels", "annotations"),
    [
        pytest.param(
            {"podGroup": "Coscheduling"},
            "scheduling.x-k8s.io/v1alpha1",
            {"minMember": 4},
            {"scheduling.x-k8s.io/pod-group": "tj"},
            {},
            id="coscheduling",
        ),
        pytest.param(
            {"podGroup": "Coscheduling", "scheduleTimeoutSeconds": 60, "queue": "ignored"},
            "scheduling.x-k8s.io/v1alpha1",
            {"minMember": 4, "scheduleTimeoutSeconds": 60},
            {"scheduling.x-k8s.io/pod-group": "tj"},
            {},
            id="coscheduling-timeout",
        ),
        pytest.param(
            {"podGroup": "Volcano", "queue": "research"},
            "scheduling.volcano.sh/v1beta1",
            {"minMember": 4, "queue": "research"},
            {},
            {"scheduling.k8s.io/group-name": "tj"},
            id="volcano-queue",
        ),
    ],
)
def test_pod_group_and_pod_metadata(
    gang: dict, api: str, spec: dict, labels: dict, annotations: dict
) -> None:
    g = GangSpec.model_validate(gang)
    body = pod_group(name="tj", namespace="ns", uid="u", gang=g, min_member=4)
    assert (body["apiVersion"], body["kind"], body["spec"]) == (api, "PodGroup", spec)
    assert body["metadata"]["name"] == "tj" and body["metadata"]["namespace"] == "ns"
    assert gang_pod_metadata(name="tj", gang=g) == (labels, annotations)


def test_worker_pods_carry_the_group_and_keep_the_template_annotations() -> None:
    spec = TorchJobSpec.model_validate(
        {
            "replicas": 2,
            "scheduling": {"gang": {"podGroup": "Volcano"}, "schedulerName": "volcano"},
            "template": {
                "metadata": {"annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "t", "image": "i"}]},
            },
        }
    )
    pod = worker_pod(
        name="tj", namespace="ns", uid="u", spec=spec, index=1, generation=0, replicas=2
    )
    assert pod["metadata"]["annotations"] == {"a": "b", "scheduling.k8s.io/group-name": "tj"}
    assert pod["spec"]["schedulerName"] == "volcano"


def test_no_gang_no_group_metadata() -> None:
    assert gang_pod_metadata(name="tj", gang=None) == ({}, {})


def test_gang_needs_a_known_pod_group() -> None:
    with pytest.raises(ValueError, match="podGroup"):
        GangSpec.model_validate({"podGroup": "Kube"})
