"""bench/goodput_profile.py: a row's profile counts what bench/goodput.py counts."""

from __future__ import annotations

from pathlib import Path

from bench import goodput_profile as prof


def _row() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Two workers, 20 samples a step every 0.1 s (200/s ideal); killed at 10 s, 5 s at 1
    worker; the window ends at 30 s and the pods drain 20 s more after the job is deleted."""
    events: list[dict[str, object]] = []
    samples = 0
    for start, end, gen, world in ((0, 10, 0, 2), (10, 15, 1, 1), (15, 50, 2, 2)):
        for i in range(round((end - start) * 10)):
            samples += 10 * world
            t = round(start + i / 10, 3)
            events.append({"ev": "step", "t": t, "gen": gen, "world": world, "samples": samples})
    trace: list[dict[str, object]] = [
        {"t": 9.95, "what": "kill", "pod": "gp-worker-1"},
        {"t": 30.0, "what": "window", "t0": 0.0, "t1": 30.0},
    ]
    return events, trace


def test_the_rows_shortfall_is_over_its_window_not_to_the_last_step() -> None:
    events, trace = _row()
    *costs, whole = prof.preemption_costs(events, trace, ideal_rate=200.0)
    assert len(costs) == 1 and costs[0].startswith("  preempted +9.9s")
    # The window trained 5,500 samples (27.5 s of ideal training) in 30 s; the 20 s of drain
    # after it, at the full rate, are not the row's (with them: 2.5 s short of 49.9 s, 0.050).
    assert "of 30.0s" in whole
    assert whole.endswith("the row's whole shortfall 2.5s (0.083)")
    assert prof.shortfall_window(events, trace) == (0.0, 30.0)


def test_without_a_window_line_the_row_runs_from_its_first_to_its_last_step() -> None:
    events, trace = _row()
    whole = prof.preemption_costs(events, trace[:1], ideal_rate=200.0)[-1]
    assert "of 49.9s" in whole
    assert whole.endswith("the row's whole shortfall 2.5s (0.050)")


def _recoveries(row: str, loss: str) -> tuple[list[str], int]:
    """A committed hard row's recoveries (``row``: its part's folder and number under
    bench/results), and the index of the line that starts with ``loss``."""
    path = Path(__file__).resolve().parents[2] / "bench" / "results" / f"{row}-Elastic-hard-ddp"
    events = prof.read_jsonl(Path(f"{path}-events.jsonl.gz"))
    trace = prof.read_jsonl(Path(f"{path}-trace.jsonl.gz"))
    lines = prof.split_recoveries(events, trace)
    return lines, lines.index(next(x for x in lines if x.startswith(loss)))


def test_a_replacement_under_a_new_index_is_the_one_that_follows_the_kill() -> None:
    """bench/results/2026-11-30d (an elastic job replaces a SIGKILLed pod under a new index):
    the replacement was looked up by the dead pod's name, and the first kill (gp-worker-0) was
    paired with the gp-worker-0 created 35 s later for another loss, after the real
    replacement (gp-worker-8, created 1.2 s after the kill) had joined."""
    lines, first = _recoveries("2026-11-30d/run1/03", "kill gp-worker-0 (gen 0 -> 1)")
    replacement = lines[first + 1]
    assert replacement.startswith("  replacement pod created +1.15s: "), replacement
    assert "generation published" in replacement and "group formed" in replacement


def _pod(
    t: float, uid: str, phase: str, containers: list[str], **more: object
) -> dict[str, object]:
    return {"t": t, "what": "pod", "pod": "gp-worker-1", "uid": uid, "phase": phase,
            "containers": containers, **more}  # fmt: skip


def test_stopped_pods_splits_a_leavers_end_and_leaves_out_the_killed() -> None:
    trace = [
        _pod(10.0, "a", "Running", ["running"], deleting=True),
        _pod(16.0, "a", "Failed", ["terminated:75"], deleting=True, finished=12.0),
        {"t": 17.0, "what": "pod-gone", "uid": "a"},
        # A pod of a lost node: SIGKILLed on the node's return, not a stop on request.
        _pod(20.0, "b", "Running", ["running"], deleting=True),
        _pod(60.0, "b", "Failed", ["terminated:137"], deleting=True, finished=59.0),
        {"t": 61.0, "what": "pod-gone", "uid": "b"},
    ]
    line = prof.stopped_pods(trace)
    assert line == (
        "pods that stopped when deleted (n=1), from the deletion: "
        "exited p50 2.0s, reported p50 6.0s, gone p50 7.0s"
    )
    assert prof.stopped_pods(trace[3:]) is None


def test_a_replacement_the_next_generation_already_holds_is_taken_in_at_once() -> None:
    """bench/results/2026-12-07b, kill 7: gp-worker-8 was killed 0 s into the generation
    that had shrunk around kill 6, and the operator published generation 12 with both
    replacements in it (index 3 on its way, index 1 not yet created). The profile looked for
    the first generation *after* 12 and reported a 42 s wait for gp-worker-1."""
    lines, kill = _recoveries("2026-12-07b/hard-0/02", "kill gp-worker-8 (gen 11 -> 12)")
    replacement = lines[kill + 1]
    published = float(replacement.split("generation published ")[1].split("s,")[0])
    formed = float(replacement.split("group formed ")[1].rstrip("s"))
    assert published <= 0.0 and 0.0 < formed < 5.0, replacement
    # The replacement of kill 6 waited in generation 12 as well: for kill 7's.
    assert "generation published +0.00s, group formed +3.18s" in lines[kill - 1]
