"""Gang scheduling against the real coscheduling PodGroup CRD (issue 17).

The CRD is scheduler-plugins' own (config/crd/bases/scheduling.x-k8s.io_podgroups.yaml of
sigs.k8s.io/scheduler-plugins at SCHEDULER_PLUGINS_VERSION, taken from the Go module proxy by
`make testbin`), so the API server validates the PodGroups the operator writes. The
coscheduling scheduler itself is not run here: the pods go to the default scheduler, and the
test checks the PodGroup (owner, minMember in step with a scale) and the pods' group label.
"""

from __future__ import annotations

import os

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

pytestmark = pytest.mark.cluster

GROUP, VERSION = "scheduling.x-k8s.io", "v1alpha1"


@pytest.fixture(scope="module")
def coscheduling_crd(cluster: k.Cluster) -> None:
    v = k.read_versions()["SCHEDULER_PLUGINS_VERSION"]
    crd = k.testbin_root() / f"podgroup-crds-{v}" / "scheduling.x-k8s.io_podgroups.yaml"
    if not crd.is_file():
        msg = f"{crd} missing: run `make testbin` (or hack/build-testbin.sh podgroup-crds)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    cluster.kubectl("apply", "--server-side", "-f", str(crd))
    cluster.wait_established("podgroups.scheduling.x-k8s.io")


def test_gang_job_keeps_a_coscheduling_pod_group_in_step_with_its_size(
    jobs: Jobs, kube: object, coscheduling_crd: None
) -> None:
    custom = client.CustomObjectsApi(kube)
    gang = {"gang": {"podGroup": "Coscheduling", "scheduleTimeoutSeconds": 120}}
    jobs.apply(torchjob("gang", replicas=2, scheduling=gang))

    def min_member(n: int) -> dict | None:
        try:
            pg = custom.get_namespaced_custom_object(GROUP, VERSION, jobs.ns, "podgroups", "gang")
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return pg if pg["spec"].get("minMember") == n else None

    pg = k.wait_for(
        lambda: min_member(2), 30, lambda: f"PodGroup minMember 2\n{jobs.describe('gang')}"
    )
    assert pg["spec"]["scheduleTimeoutSeconds"] == 120
    job = jobs.get("gang")
    assert job is not None
    assert pg["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    pods = jobs.wait_running_pods("gang", 2, generation=0)
    assert {p.metadata.labels["scheduling.x-k8s.io/pod-group"] for p in pods} == {"gang"}

    jobs.kubectl("scale", "tj/gang", "--replicas=3")
    k.wait_for(lambda: min_member(3), 30, lambda: f"PodGroup minMember 3\n{jobs.describe('gang')}")
    jobs.wait_running_pods("gang", 3, generation=1)
    jobs.wait_events("gang", "CreatedPodGroup")
