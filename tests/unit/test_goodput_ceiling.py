"""bench/goodput_ceiling.py: the time a notice row leaves no node free, by fleet size."""

from __future__ import annotations

import random

from bench import goodput_ceiling as ce


def test_every_node_out_counts_only_the_overlap_of_all_of_them_inside_the_window() -> None:
    intervals = [(10.0, 160.0), (100.0, 250.0), (200.0, 350.0)]
    # Two nodes: both out 100-160 and 200-250 (110 s); three never at once.
    assert ce.all_out_s(intervals, 2, 0.0, 400.0) == 110.0
    assert ce.all_out_s(intervals, 3, 0.0, 400.0) == 0.0
    assert ce.all_out_s(intervals, 2, 120.0, 220.0) == 60.0  # 120-160 and 200-220


def test_a_draw_that_finds_every_node_out_waits_for_the_first_return_or_is_skipped() -> None:
    rng = random.Random(0)
    got = ce.out_intervals([0.0, 10.0, 20.0, 30.0], 2, 150.0, rng, hold_s=200.0)
    # The third waits for the first node back (150 s), the fourth for the second (160 s).
    assert got == [(0.0, 150.0), (10.0, 160.0), (150.0, 300.0), (160.0, 310.0)]
    skipped = ce.out_intervals([0.0, 10.0, 20.0], 2, 150.0, random.Random(0), hold_s=100.0)
    assert skipped == [(0.0, 150.0), (10.0, 160.0)]  # 130 s of waiting is more than 100


def test_more_nodes_leave_less_of_the_row_without_a_free_node() -> None:
    def mean(nodes: int) -> float:
        rng = random.Random(1)
        return sum(ce.share(rng, nodes, 120.0, 120.0, 30.0, 10) for _ in range(300)) / 300

    three, four = mean(3), mean(4)
    assert 0.0 < four < three < 1.0


def test_no_free_time_is_what_no_interval_covers_inside_the_window() -> None:
    free = [(0.0, 10.0), (5.0, 20.0), (30.0, float("inf"))]
    assert ce.no_free_s(free, 0.0, 100.0) == 10.0  # 20-30
    assert ce.no_free_s(free, 25.0, 100.0) == 5.0
    assert ce.no_free_s([(0.0, 10.0)], 0.0, 50.0) == 40.0


def test_with_spares_a_notice_frees_a_spare_after_the_provision_or_once_one_is_back() -> None:
    # Two nodes in use, one spare; notices at 0 and 10 s; a node out 150 s, a spare 60 s.
    got = ce.spare_intervals([0.0, 10.0], 2, 1, (120.0, 30.0, 60.0), random.Random(0), 300.0)
    struck = sorted(b for a, b in got if b != float("inf"))
    assert struck == [0.0, 10.0]
    new = sorted(a for a, b in got if a > 0.0)
    # The first notice's spare is Ready at 60 s; the second's waits for the first noticed
    # node to come back as a spare (150 s).
    assert new == [60.0, 150.0]
    # Nothing free from 10 s to 60 s.
    assert ce.no_free_s(got, 0.0, 200.0) == 50.0


def test_spares_leave_less_of_a_120_s_notice_row_without_a_free_node() -> None:
    def mean(spares: int) -> float:
        rng = random.Random(2)
        total = 0.0
        for _ in range(300):
            times = ce.sch.poisson_times(rng, 120.0, 10)
            if spares:
                free = ce.spare_intervals(times, 3, spares, (120.0, 30.0, 60.0), rng, 360.0)
                total += ce.no_free_s(free, 0.0, times[-1] + 120.0) / (times[-1] + 120.0)
            else:
                out = ce.out_intervals(times, 3, 150.0, rng, 360.0)
                total += ce.all_out_s(out, 3, 0.0, times[-1] + 120.0) / (times[-1] + 120.0)
        return total / 300

    assert mean(3) < mean(1) < mean(0)
