"""The operator's /metrics leaves out prometheus_client's *_created and GC series and keeps
its own and the process series."""

from __future__ import annotations

from tests import kube as k

from torchjob_operator.engine import exposition, job_metrics, metrics


def test_a_scrape_carries_no_created_or_gc_series_but_the_operators_and_the_process() -> None:
    exposition.lean_registry()
    exposition.lean_registry()  # a second operator in one process: no error
    metrics.RECONCILES.inc()
    page = exposition.body().decode()
    names = {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line[:1] != "#"}
    assert "torchjob_reconciles_total" in names and "process_cpu_seconds_total" in names
    assert not [n for n in names if n.endswith("_created") or n.startswith("python_gc_")], names


def test_the_endpoint_answers_a_scrape_and_refuses_what_is_not_one() -> None:
    import socket
    import urllib.error
    import urllib.request

    from prometheus_client import REGISTRY

    def scrapes() -> tuple[float, float]:
        count = REGISTRY.get_sample_value("torchjob_scrapes_total") or 0.0
        return count, REGISTRY.get_sample_value("torchjob_scrape_cpu_seconds_total") or 0.0

    before = scrapes()
    listener = exposition.serve(0, "127.0.0.1")
    port = listener.getsockname()[1]
    try:
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/metrics?x=1", timeout=5) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            page = r.read()
        assert b"torchjob_reconciles_total" in page
        assert int(r.headers["Content-Length"]) == len(page)
        head = urllib.request.Request(f"{url}/", method="HEAD")
        with urllib.request.urlopen(head, timeout=5) as r:
            assert r.status == 200 and r.read() == b""
        for path, method, code in (("/other", "GET", 404), ("/metrics", "POST", 405)):
            req = urllib.request.Request(
                url + path, method=method, data=b"" if method == "POST" else None
            )
            try:
                urllib.request.urlopen(req, timeout=5)
                raise AssertionError(f"{method} {path} answered")
            except urllib.error.HTTPError as e:
                assert e.code == code
        # Not HTTP at all, then a client that goes away mid-head: each answered or dropped,
        # and the endpoint still serves the next scrape.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"hello\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 400 ")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"GET /metr")
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            assert r.status == 200
            last = r.read().decode()
        # Every request is counted with its thread's CPU, the last one once it is answered.
        counted = k.wait_for(lambda: scrapes()[0] - before[0] >= 7 and scrapes(), 10, "7 counted")
        assert counted[0] - before[0] == 7 and counted[1] > before[1], (before, counted)
        assert f"torchjob_scrapes_total {before[0] + 6:.1f}" in last
    finally:
        listener.close()


def test_the_own_text_writer_writes_what_prometheus_client_writes_byte_for_byte() -> None:
    """exposition.text against prometheus_client's generate_latest over every kind of
    family it writes, label values that need escaping, and values where Go's number format
    differs from Python's (a million and more, the infinities, NaN, negatives, integers)."""
    import math

    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        Info,
        Summary,
        disable_created_metrics,
        enable_created_metrics,
        generate_latest,
    )

    exposition.lean_registry()  # the operator's: no *_created series
    reg = CollectorRegistry()
    c = Counter("tj_things", "Things\nwith a \\ in the help", ["verb", "code"], registry=reg)
    c.labels(verb="patch", code="500").inc(3)
    c.labels(verb='we"ird\\', code="a\nb").inc(1e6)
    g = Gauge("tj_level", "A level", ["job"], registry=reg)
    for i, v in enumerate((0.0, -2.5, 1234567.0, 1e21, math.inf, -math.inf, math.nan, 7, -1e7)):
        g.labels(job=f"j{i}").set(v)
    h = Histogram("tj_seconds", "Durations", buckets=(0.005, 0.5, 10.0), registry=reg)
    for v in (0.001, 0.3, 42.0):
        h.observe(v)
    s = Summary("tj_sizes", "Sizes", registry=reg)
    s.observe(3.25)
    Gauge("tj_empty", "No samples yet", ["x"], registry=reg)
    assert exposition.text(reg.collect()) == generate_latest(reg)
    enable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        Counter("tj_more", "With its creation time", registry=reg).inc()
        assert exposition.text(reg.collect()) is None  # left to generate_latest
    finally:
        disable_created_metrics()  # type: ignore[no-untyped-call]
    reg.unregister(reg._names_to_collectors["tj_more_total"])
    assert exposition.text(reg.collect()) == generate_latest(reg)
    Info("tj_build", "Build", registry=reg).info({"version": "1"})
    assert exposition.text(reg.collect()) is None  # a kind it leaves to generate_latest


def test_the_page_is_the_registrys_text_then_the_job_block() -> None:
    from prometheus_client import REGISTRY, generate_latest

    exposition.lean_registry()
    metrics.RECONCILE_SECONDS.observe(0.02)
    own = exposition.text(REGISTRY.collect())
    assert own is not None

    def steady(page: bytes) -> list[bytes]:  # the process series move between two calls
        return [line for line in page.splitlines() if b"process_" not in line]

    assert steady(own) == steady(generate_latest(REGISTRY))
    assert b"torchjob_reconcile_duration_seconds_count" in own
    page = exposition.body()
    assert page.startswith(own.split(b"\n", 1)[0]) and page.endswith(job_metrics.render())
