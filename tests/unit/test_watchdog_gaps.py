"""How close the heartbeat watchdog came to a false alarm (torchjob.launch.heartbeat.Gaps,
near_miss): the longest gap of a source seen again, and the log line past half the
threshold."""

from __future__ import annotations

from torchjob.launch.heartbeat import Gaps, near_miss


def test_a_gap_counts_once_its_source_is_seen_again() -> None:
    gaps = Gaps()
    for t in (0.0, 1.0, 2.0, 4.5, 5.5):
        gaps.seen(3, t)
    gaps.seen("store", 0.0)
    gaps.seen("store", 1.2)
    gaps.seen(5, 1.0)  # seen once, then never again: a real loss, no gap
    assert gaps.longest == {3: 2.5, "store": 1.2}
    assert gaps.closest() == (3, 2.5)


def test_no_line_below_half_the_threshold_nor_before_any_gap() -> None:
    gaps = Gaps()
    assert near_miss(gaps, 5.0, rank=1, generation=2) is None
    gaps.seen(0, 0.0)
    gaps.seen(0, 2.5)
    assert near_miss(gaps, 5.0, rank=1, generation=2) is None


def test_a_near_miss_names_the_source_its_gap_and_the_setting() -> None:
    gaps = Gaps()
    gaps.seen("store", 10.0)
    gaps.seen("store", 12.4)
    gaps.seen(4, 10.0)
    gaps.seen(4, 11.0)
    line = near_miss(gaps, 3.0, rank=2, generation=7)
    assert line is not None
    assert "rank 2's watchdog, generation 7" in line
    assert "the store's answers came 2.4s apart, 80% of the 3s" in line
    assert "TORCHJOB_SILENT_PEER_S" in line
    gaps.seen(4, 14.0)  # rank 4's beat now the longest: 3.0 s
    assert "rank 4's beats came 3.0s apart" in (near_miss(gaps, 3.0, 2, 7) or "")
