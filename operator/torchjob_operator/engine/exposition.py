"""The operator's ``/metrics`` endpoint: prometheus_client's registry (the operator's own
series, ``engine.metrics``) followed by the per-job block rendered from the cache
(``engine.job_metrics``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from torchjob_operator.engine import job_metrics


def serve(port: int, host: str = "0.0.0.0") -> Any:
    """``/metrics`` on ``port``: the operator's own series (prometheus_client's registry)
    and the per-job block (``engine.job_metrics``, rendered from the cache). Returns the
    started server (``server_port``, ``shutdown()``)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = generate_latest(REGISTRY) + job_metrics.render()
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
