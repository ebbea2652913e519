"""The operator's /metrics leaves out prometheus_client's *_created and GC series and keeps
its own and the process series."""

from __future__ import annotations

from torchjob_operator.engine import exposition, metrics


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
    finally:
        listener.close()
