"""The operator's own bookkeeping drains when jobs go (what it costs at scale is measured by
bench/operator_vs_kubeflow.py, never asserted here)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.cluster

JOBS = 200


def test_bookkeeping_is_empty_after_200_jobs_come_and_go(jobs: Jobs) -> None:
    names = [f"churn-{i:03d}" for i in range(JOBS)]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: jobs.custom.create_namespaced_custom_object(
                    GROUP, VERSION, jobs.ns, PLURAL, torchjob(n, replicas=1)
                ),
                names,
            )
        )

    def running_pods() -> int:
        pods = jobs.core.list_namespaced_pod(
            jobs.ns, label_selector=contract.LABEL_JOB_NAME, resource_version="0"
        ).items
        return sum(1 for p in pods if p.status.phase == "Running")

    k.wait_for(lambda: running_pods() >= JOBS, 180, f"{JOBS} Running pods", interval=1)
    assert jobs.operator.metric("torchjob_job_loops") >= 1, "the jobs have loops while they live"

    jobs.custom.delete_collection_namespaced_custom_object(
        GROUP, VERSION, jobs.ns, PLURAL, propagation_policy="Background"
    )

    def drained() -> bool:
        leftover = jobs.core.list_namespaced_pod(jobs.ns, label_selector=contract.LABEL_JOB_NAME)
        return not leftover.items and jobs.operator.metric("torchjob_job_loops") == 0

    # Pods deleted by the garbage collector poke their (gone) job once more: the loop that
    # starts for it must find the job gone and end too.
    k.wait_for(
        drained,
        180,
        lambda: f"torchjob_job_loops={jobs.operator.metric('torchjob_job_loops')}",
        interval=1,
    )
