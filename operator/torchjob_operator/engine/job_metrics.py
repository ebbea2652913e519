"""Per-job Prometheus series, rendered from the operator's cache (``/metrics``).

Each scrape reads the TorchJobs and their pods as the cache holds them, with no request to
the API server, so a deleted job's series end with it and a standby operator (which caches
the same objects) exports what the leader does. A scrape must cost the operator next to
nothing: an idle operator at 100 running jobs spends about 3 ms of CPU a second, and
prometheus_client formatting 1,300 samples took 6-10 ms a scrape (19.5 % of that at one
scrape per 15 s, bench/metrics_scrape.py). So every value depends only on the job object and
its pods (times are exported as timestamps: ``time() - x`` in PromQL is the age), each job's
lines are rendered once per change of either (the cache replaces a job's object on every
update, and ``Store.pods_revision`` moves with its pods) and a scrape joins them.

What only a job's history knows (each recovery's seconds and lost steps) is observed by the
leader when it writes it (``metrics.observe_history``) into :data:`RECOVERIES`, a histogram
per job kept here and rendered the same way, once per recovery: as prometheus_client
series they were 14 samples a job formatted at every scrape (1,400 at 100 jobs that each
recovered once). Goodput per pod paid over a window is a PromQL ratio of these series (the
chart's recording rules).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from torchjob.api.models import loop_step
from torchjob_operator.engine.cache import Store
from torchjob_operator.engine.nodewatch import NodeBook
from torchjob_operator.engine.recoveries import RECOVERIES, Recoveries, escape, labels_of

FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("torchjob_job_world_size", "gauge", "Worker processes of the current generation"),
    ("torchjob_job_desired_pods", "gauge", "spec.replicas: the workers the job asks for"),
    ("torchjob_job_generation_pods", "gauge", "Pods of the current generation"),
    (
        "torchjob_job_pods_paid",
        "gauge",
        "Pods of the job bound to a node and not finished (not those stuck on a lost node)",
    ),
    (
        "torchjob_job_step",
        "gauge",
        "The training loop's step rank 0 last reported (its metrics' integer step; absent "
        "where the loop reports none)",
    ),
    ("torchjob_job_reports", "gauge", "Reports rank 0 has made (status.progress.step)"),
    ("torchjob_job_progress_timestamp_seconds", "gauge", "When rank 0 last reported"),
    (
        "torchjob_job_last_checkpoint_timestamp_seconds",
        "gauge",
        "When the last checkpoint committed",
    ),
    ("torchjob_job_restarts_allowed", "gauge", "spec.failurePolicy.maxRestarts"),
    ("torchjob_job_restarts", "counter", "Group restarts charged to the job"),
    ("torchjob_job_disruptions", "counter", "Membership changes the cluster caused"),
    ("torchjob_job_losses", "counter", "Generations begun for a loss, by cause"),
    ("torchjob_job_phase", "gauge", "1 for the job's phase"),
    (
        "torchjob_job_recovery_seconds",
        "histogram",
        "From a loss (or a resize) to the first completed step of the next generation "
        "(status.history's recoverySeconds)",
    ),
    (
        "torchjob_job_steps_lost",
        "counter",
        "Steps done before a loss and done again after it (status.history's stepsLost)",
    ),
)
"""Each family's name, type and help, in the order of the page."""


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def _timestamp(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _paid(pods: list[dict[str, Any]], lost: frozenset[str] = frozenset()) -> int:
    """Pods bound to a node and not finished: what the job pays for. A pod being deleted on a
    node that stopped reporting (``lost``: Ready not True) is not: it stays Terminating there
    until the node returns or is removed while its replacement runs elsewhere, and counting
    both would bill the place twice."""
    return sum(
        1
        for p in pods
        if (node := (p.get("spec") or {}).get("nodeName"))
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not (node in lost and (p.get("metadata") or {}).get("deletionTimestamp"))
    )


def job_samples(job: Mapping[str, Any], paid: int) -> dict[str, list[str]]:
    """The job's sample lines by family (counters with their ``_total``). Values read as
    plain values; a malformed field is left out, as ``TorchJobStatus.parse`` would."""
    meta = job.get("metadata") or {}
    labels = labels_of(str(meta.get("namespace") or ""), str(meta.get("name")))
    spec = job.get("spec") or {}
    s = job.get("status") or {}
    progress = s.get("progress") or {}
    values: dict[str, float | None] = {
        "torchjob_job_world_size": _num(s.get("worldSize")) or 0.0,
        "torchjob_job_desired_pods": _num(spec.get("replicas")) or 0.0,
        "torchjob_job_generation_pods": _num(s.get("replicas")) or 0.0,
        "torchjob_job_pods_paid": float(paid),
        "torchjob_job_step": _num(loop_step(progress)),
        "torchjob_job_reports": _num(progress.get("step")),
        "torchjob_job_progress_timestamp_seconds": _timestamp(progress.get("updateTime")),
        "torchjob_job_last_checkpoint_timestamp_seconds": _timestamp(
            progress.get("lastCheckpointTime")
        ),
        "torchjob_job_restarts_allowed": _num((spec.get("failurePolicy") or {}).get("maxRestarts")),
    }
    out = {name: [f"{name}{{{labels}}} {v}"] for name, v in values.items() if v is not None}
    for name, field in (
        ("torchjob_job_restarts", "restarts"),
        ("torchjob_job_disruptions", "disruptions"),
    ):
        out[name] = [f"{name}_total{{{labels}}} {_num(s.get(field)) or 0.0}"]
    raw_losses = s.get("losses")
    losses: dict[str, Any] = raw_losses if isinstance(raw_losses, dict) else {}
    out["torchjob_job_losses"] = [
        f'torchjob_job_losses_total{{{labels},cause="{escape(str(c))}"}} {_num(n) or 0.0}'
        for c, n in sorted(losses.items())
    ]
    if isinstance(s.get("phase"), str):
        out["torchjob_job_phase"] = [
            f'torchjob_job_phase{{{labels},phase="{escape(s["phase"])}"}} 1.0'
        ]
    return out


class JobMetrics:
    """The per-job block of ``/metrics``, each job's lines kept until it or its pods change."""

    def __init__(self, store: Store, nodes: NodeBook | None = None) -> None:
        self.store = store
        self.nodes = nodes
        self._lock = threading.Lock()
        self._cache: dict[
            tuple[str, str], tuple[tuple[int, frozenset[str]], int, dict[str, list[str]]]
        ] = {}
        self._page: tuple[tuple[int, int, frozenset[str]], bytes] | None = None
        """The whole block and the store's revision it was rendered at."""

    def lost(self) -> frozenset[str]:
        """The nodes that stopped reporting, as the Node watch sees them."""
        return self.nodes.lost() if self.nodes is not None else frozenset()

    def _of(self, job: Mapping[str, Any], lost: frozenset[str]) -> dict[str, list[str]]:
        meta = job.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        rev = self.store.pods_revision(key)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == (id(job), lost) and hit[1] == rev:
            samples = hit[2]
        else:
            samples = job_samples(job, _paid(self.store.pods_of(key) or [], lost))
            self._cache[key] = ((id(job), lost), rev, samples)
        recovered = RECOVERIES.samples(key)
        return {**samples, **recovered} if recovered else samples

    def lines(self, lost: frozenset[str] = frozenset()) -> Iterator[str]:
        jobs = self.store.jobs()
        with self._lock:
            per_job = [self._of(job, lost) for job in jobs]
            live = {
                (
                    str((j.get("metadata") or {}).get("namespace") or ""),
                    str((j.get("metadata") or {}).get("name")),
                )
                for j in jobs
            }
            for gone in set(self._cache) - live:
                del self._cache[gone]
        for name, kind, text in FAMILIES:
            shown = f"{name}_total" if kind == "counter" else name  # as prometheus_client does
            yield f"# HELP {shown} {text}"
            yield f"# TYPE {shown} {kind}"
            for samples in per_job:
                yield from samples.get(name, ())

    def render(self) -> bytes:
        """The block; the last one again while nothing in the cache changed."""
        lost = self.lost()
        revision = (self.store.revision(), RECOVERIES.version, lost)
        page = self._page
        if page is not None and page[0] == revision:
            return page[1]
        body = ("\n".join(self.lines(lost)) + "\n").encode()
        self._page = (revision, body)
        return body


_current: list[JobMetrics] = []


def register(store: Store, nodes: NodeBook | None = None) -> JobMetrics:
    """The per-job block that ``/metrics`` appends (a second ``Operator``, as tests build,
    takes the first one's place)."""
    _current[:] = [JobMetrics(store, nodes)]
    return _current[0]


def render() -> bytes:
    """The per-job block of the current operator (empty before one registered)."""
    return _current[0].render() if _current else b""


__all__ = [
    "FAMILIES",
    "RECOVERIES",
    "JobMetrics",
    "Recoveries",
    "job_samples",
    "register",
    "render",
]
