"""The operator's ``/metrics`` endpoint: prometheus_client's registry (the operator's own
series, ``engine.metrics``) followed by the per-job block rendered from the cache
(``engine.job_metrics``).

A scrape every 15 s should cost under 1 % of the operator's CPU at 100 running jobs
(bench/metrics_scrape.py; measured 0.67 % for jobs that report progress, 1.7 % where no job
ever reports and the operator idles at ~3 ms of CPU a second): so the registry is kept lean
(:func:`lean_registry`) and written by :func:`text`, the per-job block is rendered once per
change, one thread answers every request with no more HTTP than a scrape needs
(:func:`serve`), and each request's CPU is counted (``torchjob_scrape_cpu_seconds_total``)."""

from __future__ import annotations

import contextlib
import math
import socket
import struct
import threading
import time
from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    REGISTRY,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from torchjob_operator.engine import job_metrics, metrics


def lean_registry() -> None:
    """What a scrape of the operator does not carry: prometheus_client's ``*_created``
    series (OpenMetrics' creation times, a gauge each beside every counter and histogram,
    which the text format's readers do not use) and the interpreter's garbage-collector
    series. Together 24 of the operator's ~55 samples, about a third of a scrape's cost
    (bench/metrics_scrape.py). The process series (CPU, memory, file descriptors) stay."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    with contextlib.suppress(KeyError):  # already gone: a second operator in one process
        REGISTRY.unregister(GC_COLLECTOR)


_TEXT_TYPES = {"counter", "gauge", "histogram", "summary"}
"""The families :func:`text` writes itself; any other makes it hand the page to
prometheus_client's ``generate_latest``."""


def _value(v: float) -> str:
    # Go's formatting (prometheus_client's floatToGoString) differs from repr only from a
    # million up, and for the infinities and NaN.
    v = float(v)
    return repr(v) if -math.inf < v < 1e6 else str(floatToGoString(v))  # type: ignore[no-untyped-call]


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def text(metrics: Iterable[Metric]) -> bytes | None:
    """The text format of ``metrics`` (a registry's ``collect()``), byte for byte what
    ``generate_latest`` writes for them, at about half its CPU (tests/unit/test_exposition.py);
    None when a family is of a kind it does not write (info, stateset, gauge histogram,
    unknown), a sample carries a timestamp, or ``*_created`` series are on (the operator
    turns them off: :func:`lean_registry`).

    Why: at 100 running jobs the idle operator spends about 2.7 ms of CPU a second, so a
    scrape every 15 s must stay under ~0.4 ms to cost under 1 % of it; prometheus_client's
    generic writer spent 0.21 of a scrape's 0.50 ms on the operator's ~80 lines, most of it
    re-validating and escaping names that are fixed and legal (bench/metrics_scrape.py)."""
    out: list[str] = []
    for m in metrics:
        if m.type not in _TEXT_TYPES:
            return None
        name = m.name + "_total" if m.type == "counter" else m.name
        doc = m.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {m.type}\n")
        for s in m.samples:
            if s.timestamp is not None or s.name in (f"{m.name}_created", f"{m.name}_gsum"):
                return None  # a timestamp; OpenMetrics' series, which it writes apart
            if s.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(s.labels.items()))
                out.append(f"{s.name}{{{labels}}} {_value(s.value)}\n")
            else:
                out.append(f"{s.name} {_value(s.value)}\n")
    return "".join(out).encode()


def body() -> bytes:
    """One scrape: the operator's own series, then the per-job block."""
    own = text(REGISTRY.collect())
    return (generate_latest(REGISTRY) if own is None else own) + job_metrics.render()


_OK_HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: " + CONTENT_TYPE_LATEST + "\r\nContent-Length: %d\r\n"
    "Connection: close\r\n\r\n"
).encode()
_MAX_REQUEST = 16384
"""A request head longer than this is refused (a scrape's is a few hundred bytes)."""


def _status(code: int, reason: str) -> bytes:
    return f"HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


def answer(request: bytes) -> bytes:
    """The whole response to one request head (pure but for :func:`body`): ``GET`` or
    ``HEAD`` of ``/metrics`` or ``/`` (any query) gets the page, another path 404, another
    method 405, a malformed head 400."""
    line = request.split(b"\r\n", 1)[0].split(b" ")
    if len(line) != 3 or not line[2].startswith(b"HTTP/"):
        return _status(400, "Bad Request")
    method, target = line[0], line[1].split(b"?", 1)[0]
    if method not in (b"GET", b"HEAD"):
        return _status(405, "Method Not Allowed")
    if target not in (b"/metrics", b"/"):
        return _status(404, "Not Found")
    page = body()
    return _OK_HEAD % len(page) + (page if method == b"GET" else b"")


def _serve_one(conn: socket.socket) -> None:
    # The kernel's timeouts, not Python's (which polls before every recv and send).
    limit = struct.pack("ll", 10, 0)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            return  # closed before a whole head: nothing to answer
        request += chunk
        if len(request) > _MAX_REQUEST:
            conn.sendall(_status(431, "Request Header Fields Too Large"))
            return
    conn.sendall(answer(request))


def serve(port: int, host: str = "0.0.0.0") -> socket.socket:
    """``/metrics`` on ``port`` (:func:`body`), one request per connection, answered in
    turn by one thread (Prometheus scrapes one at a time). Returns the listening socket
    (``getsockname()``, ``close()``).

    Not ``http.server``: parsing a request's headers into a ``Message`` and the handler's
    per-request object cost about a third of a scrape (0.1 of 0.4 ms, bench/metrics_scrape.py
    and tests/unit/test_exposition.py), and a scrape needs none of it."""
    lean_registry()
    listener = socket.create_server((host, port))

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the socket was closed
            began = time.thread_time()
            # A scraper that went away or timed out (OSError): on to the next one.
            with conn, contextlib.suppress(OSError):
                _serve_one(conn)
            metrics.SCRAPES.inc()
            metrics.SCRAPE_CPU.inc(time.thread_time() - began)

    threading.Thread(target=loop, name="torchjob-metrics", daemon=True).start()
    return listener
