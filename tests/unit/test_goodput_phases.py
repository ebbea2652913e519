"""bench/goodput_phases.py: a row's re-formations by phase, and its time without a free node."""

from __future__ import annotations

from typing import Any

from bench import goodput_phases as ph


def _steps(gen: int, world: int, first: int, times: list[float]) -> list[dict[str, Any]]:
    return [
        {"ev": "step", "t": t, "gen": gen, "world": world, "step": first + i, "pod": "p0", "pid": 1}
        for i, t in enumerate(times)
    ]


def _row() -> list[dict[str, Any]]:
    """Steps every 1 s; at 10 s a hand-over to one new process (p3, pid 9) whose group forms
    1.5 s after the last step, every rank restored at 2.0 s, the first step 3.5 s after the
    last, the second 1.5 s long; then a shrink to 3 with nothing new and one normal step."""
    events = _steps(0, 4, 1, [float(t) for t in range(1, 11)])
    events += [{"ev": "group", "t": 0.5, "gen": 0, "pod": f"p{i}", "pid": 1} for i in range(4)]
    events += [
        {"ev": "group", "t": 11.5, "gen": 1, "pod": "p3", "pid": 9},
        {"ev": "restored", "t": 12.0, "gen": 1, "pod": "p3", "pid": 9},
        {"ev": "group", "t": 12.0, "gen": 1, "pod": "p0", "pid": 1},
        {"ev": "restored", "t": 12.0, "gen": 1, "pod": "p0", "pid": 1},
    ]
    events += _steps(1, 4, 11, [13.5, 15.0, 16.0, 17.0])
    events += [{"ev": "restored", "t": 17.5, "gen": 2, "pod": "p0", "pid": 1}]
    events += _steps(2, 3, 15, [18.5, 19.5])
    return events


def test_each_reformation_is_cut_into_its_phases_and_costed_against_the_median_step() -> None:
    lines = ph.reformations(_row())
    assert lines[0] == "re-formations (the median step 1.00s):"
    hand = lines[1]
    assert hand.startswith("  gen  1 hand-over 4->4, 1 new: "), hand
    # 3.5 s to the first step less one median step (2.5), plus the second's 0.5 s over one.
    assert "new in the group 1.50s, every rank restored 2.00s, first step 1.50s" in hand
    assert hand.endswith("second step 1.50s, cost 3.00s")
    shrink = lines[2]
    assert shrink.startswith("  gen  2 shrink 4->3, 0 new: new in the group -,"), shrink
    assert shrink.endswith("cost 0.50s")
    assert lines[3].startswith("hand-over (n=1), p50: ") and lines[3].endswith("cost 3.00s")
    assert lines[4].startswith("shrink (n=1), p50: new in the group -,")


def test_a_replacement_that_reuses_a_pods_name_and_pid_is_a_new_process() -> None:
    # p3 was a member of generation 0 (pid 9) and was lost; its replacement, a new pod under
    # the same name, starts (its "start" event) and its trainer is pid 9 again.
    events = _row()
    for e in events:
        if e.get("pod") == "p3":
            e["pid"] = 9
    events += [{"ev": "start", "t": 10.5, "gen": 1, "pod": "p3", "pid": 1}]
    hand = ph.reformations(events)[1]
    assert hand.startswith("  gen  1 hand-over 4->4, 1 new: "), hand


def test_a_row_without_two_steps_of_one_generation_has_no_reformations() -> None:
    assert ph.reformations(_steps(0, 2, 1, [1.0])) == []


def test_time_without_a_free_node_counts_only_while_every_struck_node_is_out() -> None:
    trace: list[dict[str, Any]] = [
        {"t": 0.0, "what": "window", "t0": 0.0, "t1": 100.0},
        {"t": 10.0, "what": "notice120", "node": "a"},
        {"t": 20.0, "what": "notice120", "node": "b"},  # both out from 20 s ...
        {"t": 50.0, "what": "returned", "node": "a"},  # ... to 50 s: 30 s
        {"t": 90.0, "what": "vanish", "node": "a"},  # both out again from 90 s to the end
    ]
    got = ph.no_free_node(sorted(trace, key=lambda e: e["t"]))
    assert got == (
        "every node the faults struck (2) noticed or gone at once: 40.0s of the 100.0s "
        "window (0.400)"
    )


def test_a_row_without_node_faults_says_nothing_about_free_nodes() -> None:
    trace = [{"t": 0.0, "what": "window", "t0": 0.0, "t1": 10.0}, {"t": 1.0, "what": "kill"}]
    assert ph.no_free_node(trace) is None
