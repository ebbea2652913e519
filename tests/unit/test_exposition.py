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
