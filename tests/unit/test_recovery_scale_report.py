"""bench/recovery_scale_report.py: every failed re-formation is in the table (issue 39)."""

from __future__ import annotations

from bench.recovery_scale_report import PHASES, Loss, each_line, row_line


def _loss(recovery: float | None, generations: int = 1, from_memory: bool = True) -> Loss:
    phases = {p: 0.0 for p in PHASES} if recovery is not None else {}
    if recovery is not None:
        phases["reform"] = recovery
    return Loss(8, recovery, 0, phases, generations, from_memory)


def test_a_loss_fails_when_never_recovered_re_formed_twice_or_read_storage() -> None:
    assert not _loss(0.5).failed
    assert _loss(None).failed
    assert _loss(0.5, generations=2).failed
    assert _loss(0.5, from_memory=False).failed


def test_the_row_counts_failed_re_formations_and_times_only_the_recovered() -> None:
    losses = [_loss(0.2), _loss(0.4), _loss(None), _loss(56.8, generations=2)]
    line = row_line(8, "shrink", "zero", losses, 0.02)
    assert "4/2" in line.split()
    # p50/p95 over the three recovered (0.2, 0.4, 56.8): the rounded-index percentiles
    assert "0.40s" in line and "56.80s" in line
    each = each_line(losses)
    assert each.count("NOT RECOVERED") == 1
    assert "56.80s (reform 56.80s) FAILED RE-FORMATION (2 re-formations)" in each
    assert "FAILED RE-FORMATION (from storage)" in each_line([_loss(1.0, from_memory=False)])


def test_a_row_of_only_failed_losses_prints_without_times() -> None:
    line = row_line(2, "replace", "nonzero", [_loss(None)], float("nan"))
    assert "1/1" in line.split() and "nan" in line
