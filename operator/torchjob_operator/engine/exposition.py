"""The operator's ``/metrics`` endpoint: prometheus_client's registry (the operator's own
series, ``engine.metrics``) followed by the per-job block rendered from the cache
(``engine.job_metrics``).

A scrape every 15 s must cost under 1 % of an operator that idles at about 3 ms of CPU a
second at 100 running jobs (bench/metrics_scrape.py): 0.45 ms a scrape. prometheus_client's
``generate_latest`` spent 0.33-0.39 ms of that on the operator's ~55 own samples, most of it
checking and escaping each sample's name against the UTF-8 name rules on every scrape.
:func:`text` writes the same bytes (tests/unit/test_exposition.py compares them on a
registry with every kind of family) with what a family's name and help come to worked out
once; the values are formatted by prometheus_client's own ``floatToGoString``."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    REGISTRY,
    disable_created_metrics,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _go_float

from torchjob_operator.engine import job_metrics

# prometheus_client's munging of OpenMetrics family types into the text format's.
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
"""Samples the text format moves into a gauge family of their own, after the family."""

_heads: dict[tuple[str, str, str], str] = {}


def _head(name: str, kind: str, documentation: str) -> str:
    key = (name, kind, documentation)
    head = _heads.get(key)
    if head is None:
        if not _legacy(name):
            raise ValueError(f"metric name {name!r} needs escaping: use generate_latest")
        shown = name + _TEXT_SUFFIX.get(kind, "")
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        text_type = "untyped" if kind == "unknown" else _TEXT_TYPE.get(kind, kind)
        head = _heads[key] = f"# HELP {shown} {doc}\n# TYPE {shown} {text_type}\n"
    return head


_LEGACY = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_checked: set[str] = set()


def _legacy(name: str) -> bool:
    """A name of the classic character set (every torchjob, process and python series):
    written as it is. Each name is checked once."""
    if name in _checked:
        return True
    if _LEGACY.match(name) is None:
        return False
    _checked.add(name)
    return True


def _value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def floatToGoString(value: float) -> str:
    """prometheus_client's value formatting (typed here: the library's is not)."""
    return str(_go_float(value))  # type: ignore[no-untyped-call]


def _line(name: str, labels: dict[str, str], value: float, timestamp: Any) -> str:
    if labels:
        pairs = ",".join(f'{k}="{_value(v)}"' for k, v in sorted(labels.items()))
        name = f"{name}{{{pairs}}}"
    if timestamp is not None:
        return f"{name} {floatToGoString(value)} {int(float(timestamp) * 1000):d}\n"
    return f"{name} {floatToGoString(value)}\n"


def text(registry: Collector = REGISTRY) -> bytes:
    """The text exposition format of ``registry``: the bytes ``generate_latest`` gives."""
    out: list[str] = []
    for family in registry.collect():
        out.append(_head(family.name, family.type, family.documentation))
        moved: dict[str, list[str]] = {}
        for s in family.samples:
            if not _legacy(s.name) or any(not _legacy(k) for k in s.labels):
                raise ValueError(f"sample {s.name} {s.labels} needs escaping: use generate_latest")
            line = _line(s.name, s.labels, s.value, s.timestamp)
            suffix = next((x for x in _OM_SUFFIXES if s.name == family.name + x), None)
            if suffix is None:
                out.append(line)
            else:
                moved.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(moved.items()):
            out.append(_head(family.name + suffix, "gauge", family.documentation))
            out.extend(lines)
    return "".join(out).encode()


def lean_registry() -> None:
    """What a scrape of the operator does not carry: prometheus_client's ``*_created``
    series (OpenMetrics' creation times, a gauge each beside every counter and histogram,
    which the text format's readers do not use) and the interpreter's garbage-collector
    series. Together 24 of the operator's ~55 samples, about a third of a scrape's cost
    (bench/metrics_scrape.py). The process series (CPU, memory, file descriptors) stay."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    with contextlib.suppress(KeyError):  # already gone: a second operator in one process
        REGISTRY.unregister(GC_COLLECTOR)


def serve(port: int, host: str = "0.0.0.0") -> Any:
    """``/metrics`` on ``port``: the operator's own series (prometheus_client's registry)
    and the per-job block (``engine.job_metrics``, rendered from the cache). Returns the
    started server (``server_port``, ``shutdown()``)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    lean_registry()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = text() + job_metrics.render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    # One thread serves every request in turn: Prometheus scrapes one at a time, and a
    # thread per request cost a third of a scrape (bench/metrics_scrape.py).
    server = HTTPServer((host, port), Handler)
    server.timeout = 10
    threading.Thread(target=server.serve_forever, name="torchjob-metrics", daemon=True).start()
    return server
