"""bench/ follows the source norms (issue 40): a package whose modules stay under 400 lines,
sharing one harness, and ``make bench`` runs benchmarks only (not the harness or the parts of
the larger benchmarks)."""

from __future__ import annotations

from pathlib import Path

from bench import run_all

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_bench_module_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in BENCH.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}


def test_make_bench_runs_existing_benchmarks_that_are_not_library_modules() -> None:
    for name in run_all.BENCHMARKS:
        text = (BENCH / name).read_text()
        assert 'if __name__ == "__main__":' in text, name
    assert not {"harness.py", "plots.py", "goodput_rows.py"} & set(run_all.BENCHMARKS)
