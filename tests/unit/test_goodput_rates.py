"""bench/goodput_rates.py: the step rate of each full-size generation (issue 39)."""

from __future__ import annotations

import pytest
from bench.goodput_rates import after_loss, describe, full_size_rates


def _steps(gen: int, start: float, n: int, every: float, world: int = 8) -> list[dict]:
    return [{"gen": gen, "t": start + i * every, "world": world} for i in range(n)]


def test_each_full_size_generation_gets_its_median_rate_without_its_warm_up() -> None:
    slow_start = [{"gen": 0, "t": 0.0, "world": 8}, {"gen": 0, "t": 5.0, "world": 8}]
    steps = slow_start + _steps(0, 6.0, 20, 0.5) + _steps(2, 30.0, 20, 0.625)
    rates = full_size_rates(steps, full=8)
    assert [r.gen for r in rates] == [0, 2]
    assert rates[0].steps_per_s == pytest.approx(2.0)  # the 5 s warm-up gap left out
    assert rates[1].steps_per_s == pytest.approx(1.6)
    assert after_loss(rates) == pytest.approx((0.8, 0.8))


def test_shrunk_and_short_generations_have_no_rate() -> None:
    steps = _steps(0, 0.0, 20, 0.5) + _steps(1, 20.0, 20, 0.4, world=7) + _steps(2, 40.0, 6, 0.5)
    rates = full_size_rates(steps, full=8)
    assert [r.gen for r in rates] == [0]
    assert after_loss(rates) is None
    assert "one generation" in describe(rates)


def test_the_comparison_takes_the_median_and_the_worst_later_generation() -> None:
    steps = _steps(0, 0, 20, 0.5) + _steps(2, 20, 20, 0.5) + _steps(4, 40, 20, 1.0)
    steps += _steps(6, 70, 20, 0.5)
    med, worst = after_loss(full_size_rates(steps, full=8)) or (0, 0)
    assert med == pytest.approx(1.0) and worst == pytest.approx(0.5)
    assert describe([]) == "no full-size generation long enough to time"
