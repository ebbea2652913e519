"""bench/goodput_budget.py: a row's time against its own quiet full-size step."""

from __future__ import annotations

from typing import Any

import pytest
from bench import goodput_budget as gb


def _steps(times: list[float], gen: int, world: int) -> list[dict[str, Any]]:
    return [{"ev": "step", "t": t, "gen": gen, "world": world, "rank": 0} for t in times]


def _pod(t: float, uid: str, phase: str, **more: Any) -> dict[str, Any]:
    base = {"ready": False, "deleting": False, "containers": ["running"]}
    return {"t": t, "what": "pod", "uid": uid, "pod": f"gp-worker-{uid}", "phase": phase} | (
        base | more
    )


def test_the_rows_time_is_split_into_quiet_disturbed_smaller_and_between() -> None:
    # Full size (2): quiet 1 s steps 0-4; a replacement starts 4.5-7.5 (steps of 1.5 s);
    # quiet again to 12; a re-formation (12 -> 15); a smaller world 15-18 (gen 1, world 1).
    events = (
        _steps([0, 1, 2, 3, 4], 0, 2)
        + _steps([5.5, 7.0, 8.5], 0, 2)
        + _steps([9.5, 10.5, 11.5, 12.0], 0, 2)
        + _steps([15, 16, 17, 18], 1, 1)
    )
    trace = [
        _pod(0.0, "a", "Running", ready=True),
        _pod(4.5, "b", "Pending", containers=["waiting"]),
        _pod(5.0, "b", "Running"),
        _pod(8.6, "b", "Running", ready=True),
    ]
    b = gb.budget(events, trace, (0.0, 18.0), workers=2)
    assert b is not None
    assert b.quiet_step_s == pytest.approx(1.0)
    # 4 -> 5.5 -> 7 -> 8.5 -> 9.5: each touches the start (the pod Ready at 8.6).
    assert (b.disturbed_steps, b.disturbed_s) == (4, pytest.approx(5.5))
    assert b.disturbed_excess_s == pytest.approx(1.5)
    assert b.between_s == pytest.approx(3.0) and b.reformations == 1
    assert b.smaller_s == pytest.approx(3.0)
    assert b.quiet_s + b.disturbed_s + b.between_s + b.smaller_s == pytest.approx(18.0)
    assert "1 re-formations" in gb.budget_line(b)


def test_pods_that_cost_no_cpu_do_not_disturb() -> None:
    events = _steps([float(t) for t in range(60)], 0, 2)
    trace = [
        # Unscheduled: no node took it.
        _pod(1.0, "p", "Pending", containers=[]),
        # A member whose node stopped reporting: once Ready, now unready.
        _pod(0.0, "m", "Running", ready=True),
        _pod(2.0, "m", "Running", ready=False),
        # Deleted on that node and stuck Terminating, its container read as running: past the
        # grace period it is not a leaver that runs.
        _pod(3.0, "m", "Running", deleting=True),
        # The cpu record's line every second lets its time run out.
        *({"t": float(s), "what": "cpu"} for s in range(60)),
    ]
    b = gb.budget(events, trace, (0.0, 59.0), workers=2)
    assert b is not None
    # Only the leaver's first 35 s (3 -> 38) disturb: steps 2-3 .. 38-39.
    assert b.disturbed_steps == 37 and b.quiet_steps == 59 - 37


def test_no_quiet_step_no_budget() -> None:
    assert gb.budget(_steps([0, 1], 0, 1), [], (0.0, 1.0), workers=2) is None


def test_the_row_against_its_quiet_step_counts_full_size_steps_it_could_have_trained() -> None:
    # 4 workers of 32 samples: a full step trains 128; rank 0's counter is the world's.
    events = [
        {"ev": "step", "t": float(t), "gen": 0, "world": 4, "rank": 0, "step": t + 1,
         "samples": 128 * (t + 1)}
        for t in range(10)
    ] + [
        # A smaller world (3 workers) after a re-formation: 96 a step, still 32 per worker.
        {"ev": "step", "t": 12.0 + t, "gen": 1, "world": 3, "rank": 0, "step": 11 + t,
         "samples": 1280 + 96 * (t + 1)}
        for t in range(4)
    ]  # fmt: skip
    assert gb.full_step_samples(events, workers=4) == 128
    assert gb.full_step_samples(events[:1], workers=4) is None
    b = gb.budget(events, [], (0.0, 15.0), workers=4)
    assert b is not None and b.quiet_step_s == pytest.approx(1.0)
    # 15 quiet steps' worth of time; 10 full steps and 4 at 3/4 kept: 1664 of 1920 samples.
    assert gb.against_quiet(b, 1664, 128) == pytest.approx(1664 / 1920)
