"""The full goodput benchmark in parts (issue 39: 12-15 h on 2 cores): each part records the
code it ran (bench/goodput_runs.py), and bench/goodput_recompute.py reads parts as one table
only when they ran the same code; each node mode has its own stated mean interval."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from bench import goodput_recompute
from bench import goodput_runs as runs
from bench import goodput_schedule as sch

RUN1 = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-11-30d" / "run1"


def test_node_modes_take_their_own_mean_interval_when_one_is_given() -> None:
    assert sch.mean_interval("hard", 60.0, 120.0) == 60.0
    assert sch.mean_interval("graceful", 60.0, 120.0) == 60.0
    for mode in sch.NODE_MODES:
        assert sch.mean_interval(mode, 60.0, 120.0) == 120.0
        assert sch.mean_interval(mode, 60.0) == 60.0  # unset: --mtbf for every mode


def _record(commit: str, **trees: str) -> dict[str, object]:
    return {"commit": commit, "started": "2026-12-01T00:00:00Z", "dirty": False,
            "trees": {"operator": "a", "runtime": "b", **trees}}  # fmt: skip


def test_parts_that_ran_the_same_code_are_one_benchmark_whatever_their_commits() -> None:
    parts = {"vanish-0": _record("1" * 40), "hard-0": _record("2" * 40)}
    assert runs.code_differences(parts) == []


def test_a_part_on_other_code_or_dirty_or_unrecorded_is_named_with_the_reason() -> None:
    dirty = {**_record("3" * 40), "dirty": True}
    problems = runs.code_differences(
        {
            "vanish-0": _record("1" * 40),
            "vanish-1": _record("2" * 40, runtime="changed"),
            "hard-0": dirty,
            "hard-1": None,
        }
    )
    assert len(problems) == 3
    assert problems[0].startswith("vanish-1 (222222222) ran other code than vanish-0")
    assert problems[0].endswith(": runtime")
    assert "hard-0: ran a work tree with uncommitted code changes" in problems
    assert "hard-1: no run.json (which code it ran is unknown)" in problems


def test_the_record_names_this_checkout_and_its_code_trees(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    info = runs.record_run(tmp_path / "part", repo, ["bench/goodput.py", "--modes", "vanish"])
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert info["commit"] == head
    assert set(runs.CODE_DIRS) <= set(info["trees"])
    assert "bench/_goodput_worker.py" in info["trees"]
    assert "bench/goodput_report.py" not in info["trees"]  # a report is not what a row runs
    assert runs.read_run(tmp_path / "part") == info


def _part(root: Path, name: str, record: dict[str, object]) -> Path:
    folder = root / name
    folder.mkdir()
    for f in RUN1.glob("*.jsonl.gz"):
        shutil.copy(f, folder / f.name)
    (folder / runs.RUN_FILE).write_text(json.dumps(record))
    return folder


def test_parts_read_as_one_table_each_row_divided_by_its_own_parts_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _part(tmp_path, "hard-0", _record("1" * 40))
    b = _part(tmp_path, "hard-1", _record("2" * 40))
    assert goodput_recompute.main([str(a), str(b), "--workers", "8"]) == 0
    out = capsys.readouterr().out
    assert out.count("ideal rates (samples/s): torchjob 99.0, Kubeflow 105.8") == 2
    # the published one-part figures (bench/results/2026-11-30d), now over two parts
    assert "Elastic hard ddp: goodput 0.889 [0.889-0.889]" in out
    assert "Kubeflow hard ddp: goodput 0.284 [0.284-0.284]" in out


def test_parts_on_different_code_are_refused_unless_mixed_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _part(tmp_path, "hard-0", _record("1" * 40))
    b = _part(tmp_path, "hard-1", _record("2" * 40, operator="changed"))
    with pytest.raises(SystemExit):
        goodput_recompute.main([str(a), str(b), "--workers", "8"])
    assert "ran other code than hard-0" in capsys.readouterr().err
    assert goodput_recompute.main([str(a), str(b), "--workers", "8", "--mixed"]) == 0
    assert "MIXED: hard-1" in capsys.readouterr().err


def test_the_recount_caps_a_row_at_what_storage_held_as_the_harness_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench/results/2026-12-03a: the harness read 0.739 (the samples storage held after the
    row), the recount 0.749 (the samples trained): the recount could not read storage. The
    harness now writes what storage held into the trace (a ``storage`` line), and the recount
    applies the same cap to every row but the baselines; a row without the line is read as
    before, and said so."""
    from bench.harness import read_jsonl, write_jsonl

    part = _part(tmp_path, "hard-0", _record("1" * 40))
    assert goodput_recompute.main([str(part), "--workers", "8"]) == 0
    before = capsys.readouterr().out
    assert "no storage line in the trace (an older run)" in before
    row = next(f for f in part.glob("*-Elastic-hard-ddp-trace.jsonl.gz"))
    trace = read_jsonl(row)
    row.unlink()
    write_jsonl(row, [*trace, {"t": 0.0, "what": "storage", "committed": 0}])
    assert goodput_recompute.main([str(part), "--workers", "8"]) == 0
    after = capsys.readouterr().out
    assert "Elastic hard ddp: goodput 0.000 [0.000-0.000]" in after, after
    assert "Elastic hard ddp: goodput 0.889" in before
    assert "Kubeflow hard ddp: goodput 0.284" in after, "the other rows as they were"


def test_a_bracketed_part_divides_its_rows_by_the_median_of_the_baselines_around_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """goodput.py runs each system's baseline again after the loss rows (unless --no-bracket):
    a machine twice as fast at the end gives a baseline of twice the rate, the rows are
    divided by the median of both, and the drift is printed."""
    folder = _part(tmp_path, "hard-0", _record("1" * 40))
    for kind in ("events", "trace"):
        src = folder / f"00-RecreateGroup-none-ddp-{kind}.jsonl.gz"
        lines = [json.loads(x) for x in gzip.decompress(src.read_bytes()).splitlines()]
        for e in lines:  # the same steps with twice the samples each: twice the rate
            if kind == "events" and "samples" in e:
                e["samples"] *= 2
        body = "\n".join(json.dumps(e) for e in lines).encode()
        (folder / f"05-RecreateGroup-none-ddp-{kind}.jsonl.gz").write_bytes(gzip.compress(body))
    assert goodput_recompute.main([str(folder), "--workers", "8"]) == 0
    out = capsys.readouterr().out
    assert (
        "torchjob: baselines in the order run 99.0, 198.0 samples/s; last vs first +100.0%" in out
    )
    assert "ideal rates (samples/s): torchjob 148.5, Kubeflow 105.8" in out
    assert "Kubeflow: one baseline (not bracketed)" in out
    # 0.889 against the first baseline alone (the test above), 0.889 / 1.5 against both
    assert "Elastic hard ddp: goodput 0.592 [0.592-0.592]" in out


def test_a_part_runs_its_baselines_mirrored_around_the_rows() -> None:
    """A B C before the rows, C B A after them (None: torchjob without restore points), so
    that torchjob's baselines and those without restore points share one mean time."""
    from bench.goodput import baseline_order

    systems = [("RecreateGroup", "ddp"), ("Kubeflow", "ddp")]
    before = baseline_order(systems, plain=True, after=False)
    after = baseline_order(systems, plain=True, after=True)
    assert before == [("RecreateGroup", "ddp"), ("Kubeflow", "ddp"), None]
    assert after == before[::-1]
    slots = [*before, *after]  # the rows between them take no slot of their own here
    mean = {s: sum(i for i, x in enumerate(slots) if x == s) / 2 for s in (systems[0], None)}
    assert mean[systems[0]] == mean[None]
    assert baseline_order(systems, plain=False, after=True) == systems[::-1]
