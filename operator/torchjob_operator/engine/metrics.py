"""Prometheus metrics of the operator (served when --metrics-port is set)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
