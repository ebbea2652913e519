"""bench/goodput_accounting.py: the benchmark's accounting (issue 26, item 1)."""

from __future__ import annotations

import math
import random
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import goodput_accounting as acc


def test_the_final_commit_is_counted_from_storage_when_its_event_is_missing() -> None:
    # The stopped job's last report() committed 35,264 samples but raised before its event.
    events = [
        {"ev": "step", "samples": 35_200},
        {"ev": "commit", "samples": 35_200},
        {"ev": "step", "samples": 35_264},
    ]
    storage = [{"step": 550, "samples": 35_200}, {"step": 551, "samples": 35_264}]
    assert acc.committed_samples(events, storage) == 35_264
    assert acc.committed_samples(events) == 35_200  # events alone: the old, short count
    assert acc.committed_samples([], [{"step": 3}]) == 0


def test_a_commit_event_whose_background_commit_never_finished_does_not_count() -> None:
    # report() returned (the event) but the pod was killed before the async commit landed.
    events = [{"ev": "commit", "samples": 3_200}, {"ev": "commit", "samples": 6_400}]
    assert acc.committed_samples(events, [{"samples": 3_200}]) == 3_200


def test_each_system_is_divided_by_its_own_baseline() -> None:
    rows = [
        acc.RowFigures("RecreateGroup", "none", committed=6_000, wall=10.0, workers=2),
        acc.RowFigures("Kubeflow", "none", committed=4_000, wall=10.0, workers=2),
        acc.RowFigures("Standby", "graceful", committed=5_400, wall=10.0, workers=2, standbys=1),
        acc.RowFigures("Kubeflow", "graceful", committed=3_600, wall=10.0, workers=2),
    ]
    ideal = acc.ideal_rates(rows)
    assert ideal == {"torchjob": 600.0, "Kubeflow": 400.0}
    assert acc.goodput(rows[2], ideal) == pytest.approx(0.9)
    assert acc.goodput(rows[3], ideal) == pytest.approx(0.9)  # not 3600/6000 = 0.6
    no_kf = acc.ideal_rates(rows[:1])
    assert math.isnan(acc.goodput(rows[3], no_kf))


def test_repeated_baselines_give_the_median_rate() -> None:
    rows = [acc.RowFigures("Elastic", "none", c, 10.0, 2) for c in (5_000, 6_000, 9_000)]
    assert acc.ideal_rates(rows) == {"torchjob": 600.0}


def test_per_pod_paid_counts_the_standbys() -> None:
    row = acc.RowFigures("Standby", "graceful", 0, 1.0, workers=2, standbys=1)
    assert row.pods == 3
    assert acc.per_pod_paid(0.962, row.workers, row.standbys) == pytest.approx(0.962 * 2 / 3)
    assert acc.per_pod_paid(0.9, 8, 0) == 0.9
    with pytest.raises(ValueError, match="workers must be >= 1"):
        acc.per_pod_paid(0.9, 0, 1)


def test_victims_are_drawn_from_every_pod_at_the_same_rate() -> None:
    pods = ["gp-0", "gp-1", "gp-standby-0"]
    rng = random.Random(0)
    hits = Counter(acc.pick_victim(pods, rng) for _ in range(6_000))
    assert set(hits) == set(pods)  # the standby is preempted too
    assert all(1_700 < n < 2_300 for n in hits.values()), hits
    # The draw is reproducible from the seed whatever order the API lists the pods in.
    first = [acc.pick_victim(pods, random.Random(7), name=str) for _ in range(3)]
    again = [acc.pick_victim(pods[::-1], random.Random(7), name=str) for _ in range(3)]
    assert first == again
    with pytest.raises(ValueError, match="no running pod"):
        acc.pick_victim([], rng)


def test_spread_is_median_min_max_of_the_repeats() -> None:
    assert acc.spread([0.9, 0.8, float("nan"), 0.95]) == (0.9, 0.8, 0.95)
    assert acc.format_spread([0.9, 0.8, 0.95]) == "0.900 [0.800-0.950]"
    assert acc.format_spread([]) == "-"


def test_timeline_buckets_steps_and_the_svg_marks_each_eviction() -> None:
    steps = [100.0 + 0.1 * i for i in range(100)] + [115.0 + 0.1 * i for i in range(50)]
    points = acc.timeline(steps, t0=100.0, t_end=120.0, bucket=5.0)
    assert points == [(0.0, 10.0), (5.0, 10.0), (10.0, 0.0), (15.0, 10.0)]
    svg = acc.timeline_svg("Standby/graceful <2 pods>", points, evictions=[10.2])
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 1
    marks = [e for e in root.findall(f"{ns}line") if e.get("stroke") == "red"]
    assert len(marks) == 1


def test_a_weighted_timeline_shows_a_smaller_world_as_a_lower_line() -> None:
    times = [100.5, 101.5, 106.0, 107.0]
    weights = [64.0, 64.0, 32.0, 32.0]  # 2 workers x 32, then 1 worker x 32
    assert acc.timeline(times, 100.0, 110.0, 5.0, weights) == [(0.0, 25.6), (5.0, 12.8)]
    with pytest.raises(ValueError, match="3 weights for 4 steps"):
        acc.timeline(times, 100.0, 110.0, 5.0, weights[:3])
