"""The operator's /metrics writes the bytes prometheus_client's generate_latest writes,
for every kind of family the operator's registry holds (and the process and GC series)."""

from __future__ import annotations

import pytest
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import GaugeHistogramMetricFamily

from torchjob_operator.engine import exposition, metrics


class Frozen:
    """One collection of a registry, read the same by both writers (the process series move
    between two collections: CPU seconds, memory)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.families = list(registry.collect())

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.families)


def test_the_operators_registry_is_written_as_generate_latest_writes_it() -> None:
    metrics.RECONCILES.inc()
    metrics.API_ERRORS.labels(verb="patch", code="409").inc()
    frozen = Frozen(REGISTRY)
    assert exposition.text(frozen) == generate_latest(frozen)  # type: ignore[arg-type]


def test_every_family_kind_labels_and_escapes_as_generate_latest_does() -> None:
    registry = CollectorRegistry()
    c = Counter("jobs_seen", "Jobs seen\\ with a\nnewline", ["kind"], registry=registry)
    c.labels(kind='quote " back \\ new\nline').inc(3)
    c.labels(kind="plain").inc(0.5)
    Gauge("world_size", "Workers", registry=registry).set(float("inf"))
    h = Histogram("recovery_seconds", "Recovery", ["cause"], registry=registry)
    h.labels(cause="Killed").observe(2.5)
    Summary("step_seconds", "Steps", registry=registry).observe(0.1)
    Info("build", "Build", registry=registry).info({"version": "1.2", "commit": "abc"})

    class Gh:
        def collect(self):  # type: ignore[no-untyped-def]
            yield GaugeHistogramMetricFamily(
                "queue_seconds", "Waits", buckets=[("1", 2), ("+Inf", 5)], gsum_value=7
            )

    registry.register(Gh())  # type: ignore[arg-type]
    assert exposition.text(registry) == generate_latest(registry)


def test_a_name_that_needs_escaping_is_refused_not_written_wrongly() -> None:
    registry = CollectorRegistry()
    Gauge("ok_name", "fine", ["a"], registry=registry).labels(a="x").set(1)

    class Odd:
        def collect(self):  # type: ignore[no-untyped-def]
            from prometheus_client.core import GaugeMetricFamily

            yield GaugeMetricFamily("odd.name", "dots", value=1)

    registry.register(Odd())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"odd\.name"):
        exposition.text(registry)
