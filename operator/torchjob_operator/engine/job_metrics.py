"""Per-job Prometheus series, computed at scrape time from the operator's cache.

Nothing is counted twice or left behind: each scrape reads the TorchJobs and their pods as
the cache holds them (no request to the API server), so a deleted job's series end with it,
and a standby operator (which caches the same objects) exports the same values as the
leader. What a job went through that only its history knows (each recovery's seconds and
lost steps) is observed when the leader writes it (``metrics.observe_history``).

Goodput per pod paid, over a window, is a PromQL ratio of two of these series (the chart's
recording rule ``torchjob:job_goodput_per_pod_paid:ratio_10m``): the pods of the current
generation while it trains (reported a step within ``TRAINING_FRESH_S``) over the pods the
job holds on nodes (members, standbys, joiners and probes alike: every pod bound to a node
and not finished is paid for).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchjob_operator.engine.cache import Store

TRAINING_FRESH_S = 60.0
"""A generation trains while rank 0 reported a step within this many seconds."""

_LABELS = ["namespace", "torchjob"]
"""Not ``job``: Prometheus gives every scraped series its target's ``job`` label."""


def _seconds(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _paid(pods: list[dict[str, Any]]) -> int:
    """Pods bound to a node and not finished: what the job pays for."""
    return sum(
        1
        for p in pods
        if (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )


class JobCollector(Collector):
    """The per-job series of every TorchJob in ``store``."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def describe(self) -> list[Metric]:
        return []  # registered without a first collect (the cache may still be empty)

    def collect(self) -> Iterator[Metric]:
        g = {
            name: GaugeMetricFamily(f"torchjob_job_{name}", text, labels=_LABELS)
            for name, text in (
                ("world_size", "Worker processes of the current generation"),
                ("desired_pods", "spec.replicas: the workers the job asks for"),
                ("pods_paid", "Pods of the job bound to a node and not finished"),
                ("training_pods", "Pods of the current generation while it reports steps"),
                ("step", "The last step (report) rank 0 reported"),
                ("progress_age_seconds", "Seconds since rank 0's last report"),
                ("last_checkpoint_age_seconds", "Seconds since the last committed checkpoint"),
                ("restarts_allowed", "spec.failurePolicy.maxRestarts"),
            )
        }
        restarts = CounterMetricFamily(
            "torchjob_job_restarts", "Group restarts charged to the job", labels=_LABELS
        )
        disruptions = CounterMetricFamily(
            "torchjob_job_disruptions", "Membership changes the cluster caused", labels=_LABELS
        )
        losses = CounterMetricFamily(
            "torchjob_job_losses",
            "Generations begun for a loss, by cause",
            labels=[*_LABELS, "cause"],
        )
        phase = GaugeMetricFamily(
            "torchjob_job_phase", "1 for the job's phase", labels=[*_LABELS, "phase"]
        )
        now = self.clock()
        for job in self.store.jobs():
            meta = job.get("metadata") or {}
            key = (str(meta.get("namespace") or ""), str(meta.get("name")))
            labels = list(key)
            spec = job.get("spec") or {}
            # Read as plain values (a scrape reads every job; the models' validation cost
            # ten times as much): a malformed field reads as absent, as TorchJobStatus.parse.
            s = job.get("status") or {}
            g["world_size"].add_metric(labels, _num(s.get("worldSize")))
            g["desired_pods"].add_metric(labels, _num(spec.get("replicas")))
            g["pods_paid"].add_metric(labels, _paid(self.store.pods_of(key) or []))
            max_restarts = (spec.get("failurePolicy") or {}).get("maxRestarts")
            if isinstance(max_restarts, int):
                g["restarts_allowed"].add_metric(labels, max_restarts)
            restarts.add_metric(labels, _num(s.get("restarts")))
            disruptions.add_metric(labels, _num(s.get("disruptions")))
            for cause, n in sorted((s.get("losses") or {}).items()):
                losses.add_metric([*labels, str(cause)], _num(n))
            if isinstance(s.get("phase"), str):
                phase.add_metric([*labels, s["phase"]], 1)
            progress = s.get("progress") or {}
            reported = _seconds(progress.get("updateTime"))
            fresh = (
                reported is not None
                and now - reported <= TRAINING_FRESH_S
                and progress.get("generation") in (None, s.get("currentGeneration"))
            )
            training = _num(s.get("replicas")) if s.get("phase") == "Running" and fresh else 0
            g["training_pods"].add_metric(labels, training)
            if isinstance(progress.get("step"), int):
                g["step"].add_metric(labels, progress["step"])
            if reported is not None:
                g["progress_age_seconds"].add_metric(labels, max(0.0, now - reported))
            saved = _seconds(progress.get("lastCheckpointTime"))
            if saved is not None:
                g["last_checkpoint_age_seconds"].add_metric(labels, max(0.0, now - saved))
        yield from g.values()
        yield from (restarts, disruptions, losses, phase)


_registered: list[JobCollector] = []


def register(store: Store) -> JobCollector:
    """Export ``store``'s jobs on the default registry (once per process: a second
    ``Operator``, as tests build, takes the first one's place)."""
    while _registered:
        REGISTRY.unregister(_registered.pop())
    collector = JobCollector(store)
    REGISTRY.register(collector)
    _registered.append(collector)
    return collector


__all__ = ["TRAINING_FRESH_S", "JobCollector", "register"]
