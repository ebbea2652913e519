"""The per-job Prometheus series (engine/job_metrics.py), computed from the cache at scrape
time, and the recoveries observed from status.history when the leader writes it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from torchjob import contract
from torchjob_operator.engine import metrics
from torchjob_operator.engine.cache import ALL_NAMESPACES, Store
from torchjob_operator.engine.job_metrics import RECOVERIES, JobMetrics

NOW = datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc).timestamp()


def worker(i: int, node: str | None, phase: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"tj-worker-{i}",
            "namespace": "ns",
            "labels": {contract.LABEL_JOB_NAME: "tj", contract.LABEL_POD_INDEX: str(i)},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def samples(store: Store) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The per-job block as Prometheus' own parser reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    text = JobMetrics(store).render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_series_of_a_training_job() -> None:
    store = Store()
    store.put_job(
        {
            "metadata": {"name": "tj", "namespace": "ns"},
            "spec": {"replicas": 4, "failurePolicy": {"maxRestarts": 5}},
            "status": {
                "phase": "Running",
                "currentGeneration": 2,
                "replicas": 3,
                "worldSize": 6,
                "restarts": 1,
                "disruptions": 2,
                "losses": {"SilentPeer": 1, "Disruption": 1},
                "progress": {
                    "step": 120,
                    "metrics": {"step": 1200, "loss": 0.5},
                    "generation": 2,
                    "updateTime": "2026-01-01T00:09:50Z",
                    "lastCheckpointTime": "2026-01-01T00:05:00.000Z",
                },
            },
        }
    )
    store.replace_pods(
        ALL_NAMESPACES,
        [
            worker(0, "a", "Running"),
            worker(1, "a", "Running"),
            worker(2, "b", "Running"),
            worker(3, None, "Pending"),  # not bound: not paid for
            worker(4, "c", "Failed"),  # finished: not paid for
        ],
    )
    got = samples(store)
    job = (("namespace", "ns"), ("torchjob", "tj"))

    def value(name: str, **extra: str) -> float:
        return got[(name, tuple(sorted((*job, *extra.items()))))]

    assert value("torchjob_job_world_size") == 6
    assert value("torchjob_job_desired_pods") == 4
    assert value("torchjob_job_generation_pods") == 3
    assert value("torchjob_job_pods_paid") == 3
    # The loop's own step, and the reports it took to tell it (one per 10 steps here).
    assert value("torchjob_job_step") == 1200
    assert value("torchjob_job_reports") == 120
    assert value("torchjob_job_progress_timestamp_seconds") == NOW - 10
    assert value("torchjob_job_last_checkpoint_timestamp_seconds") == NOW - 300
    assert value("torchjob_job_restarts_allowed") == 5
    assert value("torchjob_job_restarts_total") == 1
    assert value("torchjob_job_disruptions_total") == 2
    assert value("torchjob_job_losses_total", cause="SilentPeer") == 1
    assert value("torchjob_job_phase", phase="Running") == 1


def test_a_jobs_lines_are_rendered_again_only_when_it_or_its_pods_change() -> None:
    store = Store()
    body = {"metadata": {"name": "tj", "namespace": "ns"}, "spec": {"replicas": 2}, "status": {}}
    store.put_job(body)
    store.replace_pods(ALL_NAMESPACES, [worker(0, "a", "Running")])
    metrics = JobMetrics(store)
    first = metrics.render()
    cached = metrics._cache[("ns", "tj")]
    assert metrics.render() == first and metrics._cache[("ns", "tj")] is cached
    store.put_pod(worker(1, "a", "Running"))  # a pod more: rendered again
    assert b'torchjob_job_pods_paid{namespace="ns",torchjob="tj"} 2.0' in metrics.render()
    store.put_job({**body, "status": {"phase": "Running"}})  # the job changed
    assert b'phase="Running"' in metrics.render()
    store.drop_job(("ns", "tj"))
    assert b"torchjob=" not in metrics.render(), "a deleted job's series end with it"


def test_a_completed_recovery_is_observed_once() -> None:
    record = {"generation": 3, "began": "x", "cause": "SilentPeer", "worldSize": 2}
    old = {"history": [record]}
    new = {"history": [{**record, "recoverySeconds": 4.5, "stepsLost": 2}]}
    metrics.forget_job("m", "j")
    metrics.observe_history("m", "j", old, new)
    metrics.observe_history("m", "j", new, new)  # already seen: not again
    assert RECOVERIES.of(("m", "j")) == (1, 4.5, 2)
    metrics.forget_job("m", "j")
    assert RECOVERIES.of(("m", "j")) is None


def test_a_jobs_recoveries_are_a_histogram_in_its_block_until_it_goes() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    store = Store()
    store.put_job({"metadata": {"name": "tj", "namespace": "ns"}, "spec": {"replicas": 2}})
    block = JobMetrics(store)
    assert b"torchjob_job_recovery_seconds_bucket{" not in block.render()
    for seconds, lost in ((2.5, 1), (40.0, 3)):
        RECOVERIES.observe(("ns", "tj"), seconds, lost)
    families = {f.name: f for f in text_string_to_metric_families(block.render().decode())}
    buckets = {
        s.labels["le"]: s.value
        for s in families["torchjob_job_recovery_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert (buckets["2.0"], buckets["3.0"], buckets["30.0"], buckets["60.0"]) == (0, 1, 1, 2)
    assert buckets["+Inf"] == 2
    samples = {s.name: s.value for s in families["torchjob_job_recovery_seconds"].samples}
    assert samples["torchjob_job_recovery_seconds_sum"] == 42.5
    assert samples["torchjob_job_recovery_seconds_count"] == 2
    (lost,) = families["torchjob_job_steps_lost"].samples  # the parser drops _total
    assert lost.labels == {"namespace": "ns", "torchjob": "tj"} and lost.value == 4
    RECOVERIES.forget(("ns", "tj"))
    assert b"torchjob_job_recovery_seconds_bucket{" not in block.render()


def test_a_pod_stuck_terminating_on_a_lost_node_is_not_paid_beside_its_replacement() -> None:
    """Issue 39: a pod deleted on a node that stopped reporting stays Terminating there while
    its replacement runs on another node; the job pays for one place, not two. Once the node
    reports again the pod counts until it is gone; a pod being deleted on a healthy node
    (its grace period) counts too."""
    from torchjob_operator.common.nodes import NodeView
    from torchjob_operator.engine.nodewatch import NodeBook

    store = Store()
    store.put_job({"metadata": {"name": "tj", "namespace": "ns"}, "spec": {"replicas": 2}})
    stuck = worker(1, "gone", "Running")
    stuck["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    store.replace_pods(
        ALL_NAMESPACES, [worker(0, "a", "Running"), stuck, worker(2, "b", "Running")]
    )
    book = NodeBook()
    book.replace({n: NodeView(n) for n in ("a", "b", "gone")})
    metrics = JobMetrics(store, book)
    paid = b'torchjob_job_pods_paid{namespace="ns",torchjob="tj"} '
    assert paid + b"3.0" in metrics.render(), "the node reports: its grace period is paid"
    book.put(NodeView("gone", ready=False))
    assert paid + b"2.0" in metrics.render()
    book.put(NodeView("gone"))
    assert paid + b"3.0" in metrics.render()


def test_a_loop_that_reports_no_step_has_a_report_count_and_no_step_series() -> None:
    """A step series of the report count would read as steps and be reports (a loop that
    reports once per checkpoint); without the loop's step there is none."""
    store = Store()
    for name, metrics_ in (("plain", {"loss": 0.1}), ("flag", {"step": True})):
        store.put_job(
            {
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"replicas": 1},
                "status": {"phase": "Running", "progress": {"step": 7, "metrics": metrics_}},
            }
        )
    got = samples(store)
    for name in ("plain", "flag"):
        job = (("namespace", "ns"), ("torchjob", name))
        assert got[("torchjob_job_reports", job)] == 7
        assert ("torchjob_job_step", job) not in got
