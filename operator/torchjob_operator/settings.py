"""Operator settings: one typed dataclass, built once at start-up from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty means the whole cluster."""
    resync_period_s: float = 60.0
    """Seconds between reconciles of a job when nothing happens (level-based safety net)."""
    create_concurrency: int = 16
    """Pods created in parallel: a 64-worker job takes 4 rounds of API calls, not 64."""
    watch_server_timeout_s: float = 300.0
    """Server-side timeout of one watch request, so a silently dead watch is replaced (kopf #585)."""
    watch_client_timeout_s: float = 330.0
    """Client-side timeout of one watch request; a bit longer than the server's."""
    watch_connect_timeout_s: float = 30.0
    """Seconds to open a watch connection."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0 disables it."""
    liveness_endpoint: str | None = None
    """e.g. http://0.0.0.0:8081/healthz for the Deployment's liveness probe."""
    component: str = "torchjob-operator"
    """Name in the ``source`` of the Events the operator posts."""
    extra: dict[str, str] = field(default_factory=dict)


SETTINGS = OperatorSettings()
"""Replaced once by ``__main__`` before kopf starts; read-only afterwards."""
