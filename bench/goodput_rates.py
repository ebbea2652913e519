"""Is a job slower after a loss? Rank 0's step rate in each full-size generation of a goodput
row (issue 39: "after a hard loss the job stays slower"), as pure functions (unit-tested in
tests/unit/test_goodput_rates.py).

A generation's rate is 1 / the median interval between its consecutive rank-0 steps, the first
``SKIP`` steps left out (a re-formed group's first steps pay for its warm-up, not for anything
left behind). Only generations at the full world size count: a shrunk group steps at another
rate by design. ``after_loss`` compares the generations after the first with the first (the
row's undisturbed start): 1.0 means a loss left nothing behind that costs later steps.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SKIP = 3
"""Steps of a generation left out at its start."""
MIN_INTERVALS = 5
"""A generation with fewer intervals than this (after ``SKIP``) has no rate."""


@dataclass(frozen=True)
class GenRate:
    gen: int
    steps_per_s: float
    intervals: int


def full_size_rates(
    steps: Iterable[Mapping[str, Any]], full: int, skip: int = SKIP
) -> list[GenRate]:
    """Each full-size generation's step rate, in generation order (rank 0's ``step`` events:
    ``t``, ``gen``, ``world``)."""
    by_gen: dict[int, list[float]] = {}
    for e in steps:
        if int(e.get("world", full)) == full:
            by_gen.setdefault(int(e["gen"]), []).append(float(e["t"]))
    out = []
    for gen in sorted(by_gen):
        times = sorted(by_gen[gen])[skip:]
        gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
        if len(gaps) >= MIN_INTERVALS:
            out.append(GenRate(gen, 1.0 / statistics.median(gaps), len(gaps)))
    return out


def after_loss(rates: Sequence[GenRate]) -> tuple[float, float] | None:
    """(median, min) of the later full-size generations' rates over the first's; None when
    there is no later one to compare."""
    if len(rates) < 2:
        return None
    first = rates[0].steps_per_s
    later = [r.steps_per_s / first for r in rates[1:]]
    return statistics.median(later), min(later)


def describe(rates: Sequence[GenRate]) -> str:
    """One line for the table's notes: each generation's rate, then the comparison."""
    if not rates:
        return "no full-size generation long enough to time"
    each = ", ".join(f"g{r.gen} {r.steps_per_s:.2f}" for r in rates)
    cmp = after_loss(rates)
    if cmp is None:
        return f"{each} steps/s (one generation)"
    return f"{each} steps/s; later / first: median {cmp[0]:.2f}, min {cmp[1]:.2f}"
