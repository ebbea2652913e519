"""Operator settings: one typed dataclass, built once at start-up from the command line and
passed as an object (``operator.Operator`` holds it); no module reads it from a global."""

from __future__ import annotations

from dataclasses import dataclass

from torchjob_operator.common.nodes import DEFAULT_NOTICE_TAINTS, NoticeTaint


@dataclass(frozen=True)
class ElectionConfig:
    """The Lease replicas elect a leader on, and client-go's timing (``leader.py``)."""

    namespace: str
    name: str = "torchjob-operator"
    identity: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not (self.retry_period_s < self.renew_deadline_s < self.lease_duration_s):
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s} / {self.renew_deadline_s} / {self.lease_duration_s}"
            )


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty means the whole cluster."""
    resync_period_s: float = 60.0
    """Seconds between reconciles of a job when nothing happens (level-based safety net)."""
    create_concurrency: int = 16
    """Pods created in parallel: a 64-worker job takes 4 rounds of API calls, not 64."""
    max_concurrent_reconciles: int = 6
    """Jobs reconciled at once (controller-runtime's MaxConcurrentReconciles). More is not
    faster where the API server is short of CPU: measured with 40 new jobs x 8 pods on 2
    cores, 16 at once made 8.5 reconciles and 5.9 status patches per job against 4.1 and 2.9
    with 6 (a reconcile that waits longer sees more pod events at once), and the burst took
    longer. Raise it where the API server has cores to spare."""
    watch_server_timeout_s: float = 300.0
    """Server-side timeout of one watch request, so a silently dead watch is replaced (kopf #585)."""
    watch_client_timeout_s: float = 330.0
    """Client-side timeout of one watch request; a bit longer than the server's."""
    watch_connect_timeout_s: float = 30.0
    """Seconds to open a watch connection."""
    progress_batch_s: float = 1.0
    """A status write that only moves the worker counts waits up to this long to fold into
    the next write (``reconcile_once(defer_progress=...)``); phases never wait."""
    cache_deadline_s: float = 10.0
    """How long a job waits for the watches to show its last writes before its next
    reconcile reads the API server instead of the cache (``cache.py``)."""
    job_sweep_s: float = 300.0
    """Seconds between LISTs of the TorchJobs that drop from the cache any job deleted
    without a watch event: after a watch's 410 Gone kopf lists again and reports no deletion
    that happened in between (client-go's informers synthesise those deletions)."""
    watch_nodes: bool = True
    """Watch Nodes (read-only): termination notices, cordons, nodes that stop reporting."""
    notice_taints: tuple[NoticeTaint, ...] = DEFAULT_NOTICE_TAINTS
    """The Node taints that announce a node's end (``torchjob/nodes.py``)."""
    component: str = "torchjob-operator"
    """Name in the ``source`` of the Events the operator posts."""
    leader_election: ElectionConfig | None = None
    """With several replicas: the Lease they elect a leader on; None: this one always leads."""
