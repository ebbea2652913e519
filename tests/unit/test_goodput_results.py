"""bench/results keeps the raw event and trace files compressed (``*.jsonl.gz``); the readers
(bench/goodput_recompute.py, goodput_profile.py through bench/harness.py) read them as they
read a plain file, and reproduce the published tables (bench/README.md, (n) and (p))."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from bench import goodput_recompute
from bench.harness import data_files, read_jsonl, write_gz, write_jsonl

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_no_raw_event_file_of_the_results_is_kept_uncompressed() -> None:
    assert not sorted(RESULTS.rglob("*.jsonl"))
    assert len(sorted(RESULTS.rglob("*.jsonl.gz"))) >= 99
    # A row's Kubernetes Events and jobs (bench/goodput_pods.save_logs): ~1 MB of JSON each,
    # 43 of the 58 MB the results took before (the device tool sends at most 64 MiB).
    assert not sorted(RESULTS.glob("**/*-logs/*.json"))
    assert len(sorted(RESULTS.glob("**/*-logs/events.json.gz"))) >= 190


def test_a_row_s_kubernetes_dumps_are_written_compressed(tmp_path: Path) -> None:
    written = write_gz(tmp_path / "row-logs" / "events.json.gz", '{"items": []}')
    assert gzip.decompress(written.read_bytes()) == b'{"items": []}'
    assert (
        written.read_bytes() == write_gz(tmp_path / "again.json.gz", '{"items": []}').read_bytes()
    )


@pytest.mark.parametrize(
    ("run", "published"),
    [
        ("2026-11-26n", "Elastic hard ddp: goodput 0.976 [0.964-0.980]"),
        ("2026-11-26p", "Elastic graceful ddp: goodput 0.982 [0.968-0.992]"),
        ("2026-11-30d/run1", "Elastic hard ddp: goodput 0.889 [0.889-0.889]"),
        ("2026-11-30d/run1", "Kubeflow hard ddp: goodput 0.284 [0.284-0.284]"),
    ],
)
def test_the_published_goodput_is_recomputed_from_the_compressed_files(
    run: str, published: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert goodput_recompute.main([str(RESULTS / run), "--workers", "8"]) == 0
    assert published in capsys.readouterr().out
    table = (RESULTS / run / "table.txt").read_text()
    assert published.rsplit(": goodput ", 1)[1] in table


def test_the_baseline_without_restore_points_is_no_systems_divisor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run with restore points measures their overhead by a baseline without them
    (``NN-RecreateGroup-none-ddp-norp``): read back as that, not as a second torchjob
    baseline (whose median would change every torchjob row's divisor)."""
    assert goodput_recompute.main([str(RESULTS / "2026-11-30d" / "run1"), "--workers", "8"]) == 0
    out = capsys.readouterr().out
    assert "ideal rates (samples/s): torchjob 99.0, Kubeflow 105.8" in out
    assert "restore point's overhead: 1 - 99.0 / 109.2 samples/s = +0.094" in out
    # and again from the baselines' step times, which whole steps counted round (acc.step_rate)
    assert "from step times: restore point's overhead: 1 - 99.9 / 110.6 samples/s = +0.097" in out
    table = (RESULTS / "2026-11-30d" / "run1" / "table.txt").read_text()
    assert "1 - 99.0 / 109.2 samples/s = +0.094" in table


def test_a_plain_and_a_compressed_file_read_the_same(tmp_path: Path) -> None:
    rows = [{"ev": "step", "t": 1.5, "step": 1}, {"ev": "step", "t": 1.6, "step": 2}]
    write_jsonl(tmp_path / "01-a-events.jsonl", rows)
    packed = write_jsonl(tmp_path / "02-b-events.jsonl.gz", rows)
    assert gzip.decompress(packed.read_bytes()).count(b"\n") == 2
    assert read_jsonl(tmp_path / "01-a-events.jsonl") == read_jsonl(packed) == rows
    # a name without .gz finds its compressed copy; a cut last line is skipped when partial
    assert read_jsonl(tmp_path / "02-b-events.jsonl") == rows
    (tmp_path / "03-c-events.jsonl").write_text('{"ev": "step"}\n{"ev": "st')
    assert read_jsonl(tmp_path / "03-c-events.jsonl", partial=True) == [{"ev": "step"}]
    assert [p.name for p in data_files(tmp_path, "*-events.jsonl")] == [
        "01-a-events.jsonl",
        "02-b-events.jsonl.gz",
        "03-c-events.jsonl",
    ]


def test_a_rows_timeline_is_named_by_its_index_like_its_events_file(tmp_path: Path) -> None:
    """Baselines come first in the list, but the rows ran interleaved (a baseline, then the
    one without restore points): each SVG carries the row's own index, as its events file
    ``NN-...-events.jsonl.gz`` does (2026-11-30g numbered them by list position)."""
    from bench.goodput_records import Row
    from bench.goodput_report import write_timelines

    steps = {"step_times": [1.0, 2.0], "step_samples": [256.0, 256.0], "wall": 10.0}
    rows = [
        Row("RecreateGroup", "none", workers=8, index=0, **steps),  # type: ignore[arg-type]
        Row("RecreateGroup", "none", workers=8, index=2, **steps),  # type: ignore[arg-type]
        Row("RecreateGroup", "baseline-norp", workers=8, index=1, suffix="-norp", **steps),  # type: ignore[arg-type]
    ]
    names = [p.name for p in write_timelines(tmp_path, rows)]
    assert [n[:2] for n in names] == ["00", "02", "01"]
    assert names[2].startswith("01-RecreateGroup-baseline-norp-ddp-norp-")
