"""bench/goodput_accounting.py: the benchmark's accounting (issue 26, item 1)."""

from __future__ import annotations

import math
import random
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from bench import goodput_accounting as acc


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
        acc.RowFigures("RecreateGroup", "none", samples=6_000, wall=10.0, workers=2),
        acc.RowFigures("Kubeflow", "none", samples=4_000, wall=10.0, workers=2),
        acc.RowFigures("Standby", "graceful", samples=5_400, wall=10.0, workers=2, standbys=1),
        acc.RowFigures("Kubeflow", "graceful", samples=3_600, wall=10.0, workers=2),
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


def _pod(t: float, uid: str, phase: str, containers: list[str]) -> dict[str, object]:
    name = f"gp-worker-{uid[0]}"
    return {
        "t": t,
        "what": "pod",
        "pod": name,
        "uid": uid,
        "phase": phase,
        "containers": containers,
    }


def _gone(t: float, uid: str) -> dict[str, object]:
    return {"t": t, "what": "pod-gone", "pod": f"gp-worker-{uid[0]}", "uid": uid}


def test_a_leaving_pod_and_its_replacement_are_both_paid_while_they_overlap() -> None:
    # gp-worker-0 is evicted at 100 and trains through its grace period until 105; its
    # replacement (same name, another UID) was created at 101 and runs from 102.
    trace = [
        _pod(0.0, "0a", "Pending", []),
        _pod(1.0, "0a", "Pending", ["waiting"]),  # paid from here: the kubelet has it
        _pod(2.0, "0a", "Running", ["running"]),
        {"t": 100.0, "what": "evict", "pod": "gp-worker-0"},
        _pod(101.0, "0b", "Pending", []),
        _pod(101.5, "0b", "Pending", ["waiting"]),
        _pod(102.0, "0b", "Running", ["running"]),
        _pod(105.0, "0a", "Failed", ["terminated:0"]),
        _gone(106.0, "0a"),
        {"t": 1.0, "what": "job", "generation": 0, "replicas": 1},
    ]
    assert acc.pod_seconds(trace, 0.0, 200.0) == pytest.approx(104.0 + 98.5)
    # 200 s of one worker paid 202.5 pod-seconds: the 3.5 s of overlap are charged.
    assert acc.per_pod_second(1.0, 1, 200.0, 202.5) == pytest.approx(200.0 / 202.5)
    assert math.isnan(acc.per_pod_second(1.0, 1, 200.0, 0.0))
    with pytest.raises(ValueError, match="workers must be >= 1"):
        acc.per_pod_second(1.0, 0, 200.0, 1.0)


def test_a_pod_gone_early_is_paid_until_gone_and_old_traces_until_the_phase_ends() -> None:
    # Force-deleted while Running: no Failed line, only the watch's DELETED.
    trace = [_pod(10.0, "1a", "Running", ["running"]), _gone(30.0, "1a")]
    assert acc.pod_seconds(trace, 0.0, 100.0) == pytest.approx(20.0)
    # An old trace (no pod-gone lines): paid until t1, or until its phase ended.
    assert acc.pod_seconds(trace[:1], 0.0, 100.0) == pytest.approx(90.0)
    ended = [*trace[:1], _pod(40.0, "1a", "Succeeded", ["terminated:0"])]
    assert acc.pod_seconds(ended, 0.0, 100.0) == pytest.approx(30.0)
    # Lines after a pod's end do not revive it.
    assert acc.pod_seconds([*trace, _pod(50.0, "1a", "Running", [])], 0.0, 100.0) == 20.0


def test_pod_seconds_are_clipped_to_the_window() -> None:
    trace = [
        _pod(0.0, "0a", "Running", ["running"]),  # before t0: paid from t0
        _pod(5.0, "1a", "Running", ["running"]),
        _gone(8.0, "1a"),  # gone before t0: nothing
        _pod(50.0, "2a", "Running", ["running"]),
        _pod(150.0, "2a", "Failed", ["terminated:1"]),  # ends after t1: paid until t1
        _pod(120.0, "3a", "Running", ["running"]),  # starts after t1: nothing
    ]
    assert acc.pod_seconds(trace, 10.0, 110.0) == pytest.approx(100.0 + 60.0)


def test_a_pod_never_scheduled_costs_nothing() -> None:
    trace = [_pod(1.0, "4a", "Pending", []), _gone(50.0, "4a")]
    assert acc.pod_seconds(trace, 0.0, 100.0) == 0.0
    assert acc.pod_seconds([_pod(1.0, "4a", "Pending", [])], 0.0, 100.0) == 0.0


def test_the_pause_is_the_longest_stretch_without_a_step_after_the_preemption() -> None:
    # Steps every 0.1 s; preempted at 1.05; training went on until 3.0 (a drain), then 0.6 s
    # without a step while the group re-formed, then the new membership's first step at 3.6.
    steps = [i / 10 for i in range(0, 31)] + [3.6]
    assert acc.longest_pause(steps, 1.05, 3.6) == pytest.approx(0.6)
    # A shrink at once: nothing after the preemption until the first step 1.2 s later.
    assert acc.longest_pause([0.9, 1.0, 2.2], 1.05, 2.2) == pytest.approx(1.2)
    # No step before the preemption: counted from it.
    assert acc.longest_pause([2.0], 1.0, 2.0) == pytest.approx(1.0)


def _steps(spans: list[tuple[float, float, int, int]]) -> list[dict[str, float]]:
    """Rank 0's steps: (from, to, generation, world) stretches at 0.1 s a step, 10 samples
    per worker per step."""
    out: list[dict[str, float]] = []
    samples = 0
    for start, end, gen, world in spans:
        t = start
        while t < end - 1e-9:
            samples += 10 * world
            out.append({"t": round(t, 3), "gen": gen, "world": world, "samples": samples})
            t += 0.1
    return out


def test_a_preemption_costs_its_pause_and_its_smaller_stretch() -> None:
    ideal = 800.0  # 8 workers x 10 samples / 0.1 s
    # Shrink at once: 1 s pause, 9 s at 7 of 8, a 0.5 s pause, back at 8.
    shrink = _steps([(0, 10, 0, 8), (11, 20, 1, 7), (20.5, 30, 2, 8)])
    (c,) = acc.preemption_costs(shrink, [10.0], ideal)
    assert c.until == pytest.approx(20.5) and c.pause == pytest.approx(1.1, abs=0.01)
    assert c.lost_s == pytest.approx(1.0 + 9 / 8 + 0.5, abs=0.15)
    # Replace before leaving: full speed until the swap, one 0.5 s pause.
    drain = _steps([(0, 18, 0, 8), (18.5, 30, 1, 8)])
    (d,) = acc.preemption_costs(drain, [10.0], ideal)
    assert d.until == pytest.approx(18.5) and d.pause == pytest.approx(0.6, abs=0.01)
    assert d.lost_s == pytest.approx(0.5, abs=0.15)
    assert d.lost_s < c.lost_s
    # Never back at full size: costed to the last step; a preemption before any step, none.
    (e,) = acc.preemption_costs(_steps([(0, 10, 0, 8), (10, 20, 1, 7)]), [10.0], ideal)
    assert e.until == pytest.approx(19.9) and e.delivered == pytest.approx(7 / 8, abs=0.02)
    assert acc.preemption_costs(drain, [-1.0], ideal) == []
    with pytest.raises(ValueError, match="ideal_rate"):
        acc.preemption_costs(drain, [10.0], 0.0)


def _events(steps: list[dict[str, float]]) -> list[dict[str, float | str]]:
    return [{"ev": "step", **s} for s in steps]


def test_a_row_counts_what_it_trained_in_its_window_not_the_drain_after_it() -> None:
    # 2026-11-26l's 2-pod hard rows: the window ends at 30 s and the bench deletes the job;
    # the elastic pods drain (train on) 20 s before they stop and commit. Storage's latest
    # checkpoint holds those 20 s too, or, when the final one never commits, only an earlier
    # one (the stop checkpoint of a grow, at 15 s): neither is what the window trained.
    steps = _steps([(0, 10, 0, 2), (10, 15, 1, 1), (15, 50, 2, 2)])
    events = _events(steps)
    at = {s["t"]: int(s["samples"]) for s in steps}
    assert (at[0.0], at[14.9], at[30.0], at[49.9]) == (20, 2_500, 5_520, 9_500)
    # The steps in (t0, t1]: the first step (at t0) trained before the window.
    assert acc.window_samples(events, 0.0, 30.0) == 5_520 - 20
    assert acc.committed_samples(events, [{"samples": 2_500}, {"samples": 9_500}]) == 9_500
    assert acc.committed_samples(events, [{"samples": 2_500}]) == 2_500
    # Whatever happens after the window does not move it.
    assert acc.window_samples(events[:450], 0.0, 30.0) == 5_500
    # The baseline is counted the same way (no preemption, the same tail after its window).
    baseline = acc.window_samples(_events(_steps([(0, 50, 0, 2)])), 0.0, 30.0)
    assert baseline == 6_000
    rows = [
        acc.RowFigures("RecreateGroup", "none", baseline, 30.0, 2),
        acc.RowFigures("Elastic", "hard", 5_500, 30.0, 2),
    ]
    ideal = acc.ideal_rates(rows)
    assert ideal == {"torchjob": 200.0}
    # 5 s at half size cost 2.5 s of the 30: 0.917, not 9,500 / 6,000 nor 2,500 / 6,000.
    assert acc.goodput(rows[1], ideal) == pytest.approx(27.5 / 30)


def test_work_rolled_back_after_the_window_is_not_counted() -> None:
    # Killed at 29.5 s, the job resumes after the window from a checkpoint at 20 s: what it
    # trained from 20 s on was thrown away.
    steps = _steps([(0, 29.5, 0, 2)])
    at = {s["t"]: int(s["samples"]) for s in steps}
    events: list[dict[str, float | str]] = [
        *_events(steps),
        {"ev": "restored", "t": 35.0, "gen": 1, "samples": at[19.9]},
        {"ev": "restored", "t": 35.0, "gen": 1, "samples": at[19.9]},  # every rank says so
        {"ev": "step", "t": 35.1, "gen": 1, "world": 2, "samples": at[19.9] + 20},
    ]
    assert acc.window_samples(events, 0.0, 30.0) == at[19.9] - at[0.0]
    # A re-formation after the window from the survivors' memory loses nothing.
    kept: list[dict[str, float | str]] = [
        *_events(steps),
        {"ev": "restored", "t": 35.0, "gen": 1, "samples": at[29.4]},
    ]
    assert acc.window_samples(kept, 0.0, 30.0) == at[29.4] - at[0.0]
    assert acc.window_samples([], 0.0, 30.0) == 0


def test_work_trained_in_the_window_but_never_saved_counts_as_lost() -> None:
    # The stop's final commit failed: storage holds the checkpoint of 20 s, not the window's end.
    steps = _steps([(0, 29.5, 0, 2)])
    at = {s["t"]: int(s["samples"]) for s in steps}
    events = _events(steps)
    assert acc.window_samples(events, 0.0, 30.0, saved=at[19.9]) == at[19.9] - at[0.0]
    # A final checkpoint that holds the drain after the window adds nothing.
    assert acc.window_samples(events, 0.0, 30.0, saved=at[29.4] + 999) == at[29.4] - at[0.0]


def test_steps_done_again_are_counted_from_the_steps_themselves() -> None:
    """bench/results/2026-12-03e: generation 13 restored step 480 from storage after rank 0
    had reached 489, in a storm whose loss took no member; the per-loss count missed it."""
    steps = [*range(1, 490), *range(481, 535)]
    assert acc.steps_redone(steps) == 9
    assert acc.steps_redone(range(1, 100)) == 0
    assert acc.steps_redone([5, 5, 5]) == 2  # the same step done three times


def test_the_bracket_line_names_each_baseline_and_the_drift_or_says_there_is_none() -> None:
    assert acc.bracket_line("torchjob", [100.0, 90.0]) == (
        "  torchjob: baselines in the order run 100.0, 90.0 samples/s; last vs first -10.0%"
    )
    assert "not bracketed" in acc.bracket_line("Kubeflow", [100.0])


def test_the_overhead_of_bracketed_baselines_cancels_a_linear_drift() -> None:
    """A B ... B A: with restore points at t = 0 and 3, without at t = 1 and 2, the machine
    10 % faster per step of t, and a true overhead of 2 %. Each pair alone reads the drift
    into the overhead; the means do not."""
    speed = [100.0 * (1 + 0.1 * t) for t in range(4)]
    with_rp, without = [speed[0] * 0.98, speed[3] * 0.98], [speed[1], speed[2]]
    line = acc.overhead_line(with_rp, without)
    assert "= +0.020 (the means of 2 and 2 bracketed baselines" in line
    assert "alone: +0.109, -0.062)" in line
    one = acc.overhead_line([98.0], [100.0])
    assert one.startswith("restore point's overhead: 1 - 98.0 / 100.0 samples/s = +0.020")
    assert "not bracketed" in one
    assert "not measured" in acc.overhead_line([], [100.0])


def test_a_baseline_timed_by_its_steps_is_not_rounded_to_whole_steps() -> None:
    """90 steps of 256 samples, 1.65 s apart, in a 150 s window that ends 1.15 s after the
    last: the whole steps counted read the window 0.8 % slow; the step times read 155.15/s."""
    steps = [{"ev": "step", "t": 10.0 + 1.65 * i, "samples": 256 * (i + 1)} for i in range(90)]
    events = [{"ev": "restored", "t": 9.0, "samples": 0}, *steps]
    t0, t1 = 10.0, 160.0
    counted = acc.window_samples(events, t0, t1) / (t1 - t0)
    timed = acc.step_rate(events, t0, t1)
    assert timed == pytest.approx(256 / 1.65)
    assert counted == pytest.approx(89 * 256 / 150)
    assert counted < 0.995 * timed
    assert acc.step_rate(events, t0, 10.5) is None  # one step: no interval to time
    assert acc.step_rate(events, 200.0, 300.0) is None
