"""Prometheus metrics of the operator (served when --metrics-port is set)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from torchjob.api.models import TorchJobStatus
from torchjob_operator.engine.recoveries import RECOVERIES

RECONCILES = Counter("torchjob_reconciles_total", "Reconciles of TorchJobs")
PODS_CREATED = Counter("torchjob_pods_created_total", "Worker pods created")
PODS_DELETED = Counter("torchjob_pods_deleted_total", "Worker pods deleted")
TRANSITIONS = Counter("torchjob_phase_transitions_total", "TorchJob phase transitions", ["phase"])
STATUS_PATCHES = Counter("torchjob_status_patches_total", "Status writes of TorchJobs")
STATUS_DEFERRED = Counter(
    "torchjob_status_deferred_total",
    "Status writes that only moved worker counts, held back to fold into the next one",
)
RECONCILE_ERRORS = Counter("torchjob_reconcile_errors_total", "Reconciles that raised")
JOB_LOOPS = Gauge(
    "torchjob_job_loops",
    "Per-job reconcile loops the operator holds (0 once every TorchJob is gone)",
)
POD_EVENTS = Counter(
    "torchjob_pod_events", "Pod watch events received (only pods with the job-name label)"
)
CACHE_EXPIRED = Counter(
    "torchjob_cache_expectations_expired",
    "Jobs whose writes the watches had not shown within the deadline (then read live)",
)
LIVE_READS = Counter(
    "torchjob_live_reads", "Reads the cache could not answer and the API server did", ["kind"]
)
for _kind in ("job", "pods"):  # exposed as 0 from the start, not only after the first miss
    LIVE_READS.labels(kind=_kind)
GHOSTS_DROPPED = Counter(
    "torchjob_cache_ghosts_dropped",
    "TorchJobs the cache held after they were deleted (a watch missed the deletion), "
    "dropped when a write or a LIST found them gone",
)
CACHE_OBJECTS = Gauge("torchjob_cache_objects", "Objects in the operator's cache", ["kind"])

RECONCILE_SECONDS = Histogram(
    "torchjob_reconcile_duration_seconds",
    "Time of one reconcile of a TorchJob (observe, plan, writes)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
QUEUE_DEPTH = Gauge(
    "torchjob_workqueue_depth", "TorchJobs poked and waiting for their next reconcile"
)
API_ERRORS = Counter(
    "torchjob_api_errors_total",
    "Requests of the operator the API server answered with an error",
    ["verb", "code"],
)
SCRAPES = Counter("torchjob_scrapes", "Requests the /metrics endpoint answered")
SCRAPE_CPU = Counter(
    "torchjob_scrape_cpu_seconds",
    "CPU seconds the /metrics thread spent answering them (what being scraped costs the operator)",
)


def observe_history(
    namespace: str, job: str, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    """Record each generation of the status patch ``new`` whose recovery completed since
    ``old`` (the status before the write): its seconds and its lost steps."""
    if not new.get("history"):
        return
    before = {r.generation: r for r in TorchJobStatus.parse(old).history or ()}
    for r in TorchJobStatus.parse(new).history or ():
        seen = before.get(r.generation)
        if r.recovery_seconds is None or (seen is not None and seen.recovery_seconds is not None):
            continue
        if r.cause == "Start":
            continue
        RECOVERIES.observe((namespace, job), r.recovery_seconds, r.steps_lost or 0)


def forget_job(namespace: str, job: str) -> None:
    """A deleted job's series go with it."""
    RECOVERIES.forget((namespace, job))
