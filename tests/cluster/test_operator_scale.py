"""The operator's own bookkeeping (its loops, its cache) drains when jobs go (what it costs at scale is measured by
bench/operator_vs_kubeflow.py, never asserted here)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.cluster

JOBS = 200


def _bookkeeping(jobs: Jobs) -> dict[str, float]:
    op = jobs.operator
    return {
        "loops": op.metric("torchjob_job_loops"),
        **{
            kind: op.metric(f'torchjob_cache_objects{{kind="{kind}"}}')
            for kind in ("jobs", "pods", "awaiting")
        },
    }


def _what_is_left(jobs: Jobs) -> str:
    """The operator's counts, and what the cluster still holds (the operator serves every
    namespace: an earlier test's job in a namespace still being deleted counts too)."""
    left = jobs.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    pods = jobs.core.list_pod_for_all_namespaces(label_selector=contract.LABEL_JOB_NAME).items
    return (
        f"{_bookkeeping(jobs)}; TorchJobs: "
        + (", ".join(_job_line(jobs, j) for j in left[:20]) or "none")
        + "; pods: "
        + (
            ", ".join(
                f"{p.metadata.namespace}/{p.metadata.name} ({p.status.phase}, node "
                f"{p.spec.node_name}, deleting: {p.metadata.deletion_timestamp is not None})"
                for p in pods[:20]
            )
            or "none"
        )
    )


def _job_line(jobs: Jobs, job: dict[str, Any]) -> str:
    """Enough to tell a job left behind from one made again: its uid, when it was made,
    whether its deletion (or its namespace's) began, and its generation and phase."""
    meta, status = job["metadata"], job.get("status") or {}
    ns = jobs.core.read_namespace(meta["namespace"])
    return (
        f"{meta['namespace']}/{meta['name']} (uid {meta['uid'][:8]}, created "
        f"{meta['creationTimestamp']}, deleting: {bool(meta.get('deletionTimestamp'))}, "
        f"finalizers {meta.get('finalizers')}, generation {status.get('currentGeneration')}, "
        f"{status.get('phase')}; namespace {ns.status.phase}, deletion "
        f"{ns.metadata.deletion_timestamp})"
    )


def _idle(jobs: Jobs) -> bool:
    return not any(_bookkeeping(jobs).values())


def test_loops_and_cache_are_empty_after_200_jobs_come_and_go(jobs: Jobs) -> None:
    # The earlier tests' namespaces go in the background: their jobs are the operator's too.
    k.wait_for(lambda: _idle(jobs), 180, lambda: f"an idle operator first: {_what_is_left(jobs)}")
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
    op = jobs.operator
    assert op.metric("torchjob_job_loops") >= 1, "the jobs have loops while they live"
    # The reconciles read the cache the watches fill, not the API server.
    assert op.metric('torchjob_cache_objects{kind="jobs"}') >= JOBS
    assert op.metric('torchjob_cache_objects{kind="pods"}') >= JOBS
    reconciles = op.metric("torchjob_reconciles_total")
    live = op.metric('torchjob_live_reads_total{kind="pods"}')
    assert reconciles >= JOBS and live <= reconciles / 10, (reconciles, live)

    jobs.custom.delete_collection_namespaced_custom_object(
        GROUP, VERSION, jobs.ns, PLURAL, propagation_policy="Background"
    )

    def drained() -> bool:
        leftover = jobs.core.list_namespaced_pod(jobs.ns, label_selector=contract.LABEL_JOB_NAME)
        return not leftover.items and _idle(jobs)

    # Pods deleted by the garbage collector poke their (gone) job once more: the loop that
    # starts for it must find the job gone and end too.
    k.wait_for(drained, 180, lambda: _what_is_left(jobs), interval=1)
