"""bench/goodput_schedule.py: Poisson losses drawn before a row, and each loss's recovery
resolved after it (issue 39)."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
from bench import goodput_schedule as sch


def test_poisson_times_are_deterministic_for_a_seed() -> None:
    a = sch.poisson_times(random.Random(7), 40.0, 10)
    b = sch.poisson_times(random.Random(7), 40.0, 10)
    c = sch.poisson_times(random.Random(8), 40.0, 10)
    assert a == b
    assert a != c
    assert len(a) == 10


def test_poisson_times_are_strictly_increasing_and_positive() -> None:
    for seed in range(200):
        times = sch.poisson_times(random.Random(seed), 5.0, 20)
        assert times[0] > 0
        assert all(later > earlier for earlier, later in itertools.pairwise(times))


def test_poisson_gaps_have_the_stated_mean_and_exponential_spread() -> None:
    rng = random.Random(0)
    gaps: list[float] = []
    for _ in range(2_000):
        times = sch.poisson_times(rng, 60.0, 10)
        gaps += [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(60.0, rel=0.03)
    # Exponential, not the old +-20 % jitter: the standard deviation equals the mean, and
    # about 1 - 1/e of the gaps are shorter than the mean.
    assert statistics.stdev(gaps) == pytest.approx(60.0, rel=0.05)
    short = sum(g < 60.0 for g in gaps) / len(gaps)
    assert short == pytest.approx(0.632, abs=0.02)


def test_poisson_times_reject_a_non_positive_mtbf() -> None:
    with pytest.raises(ValueError, match="mtbf must be positive"):
        sch.poisson_times(random.Random(0), 0.0, 3)
    assert sch.poisson_times(random.Random(0), 10.0, 0) == []


def _step(t: float, gen: int, step: int) -> dict[str, object]:
    return {"ev": "step", "t": t, "gen": gen, "step": step, "rank": 0}


def test_a_loss_recovers_at_the_first_step_of_a_later_generation() -> None:
    events = [
        _step(1.0, 0, 1),
        _step(2.0, 0, 2),
        {"ev": "group", "t": 4.0, "gen": 1},
        _step(5.5, 1, 3),
        _step(6.5, 1, 4),
    ]
    (rec,) = sch.attribute([2.5], events)
    assert rec.gen_before == 0
    assert rec.step is not None and rec.step["step"] == 3
    assert rec.seconds == pytest.approx(3.0)  # the loss to the step's completion, nothing less


def test_overlapping_losses_are_each_attributed() -> None:
    # Loss A at 2.5 (gen 0 running); loss B at 4.0, before A's recovery (gen 1's first step at
    # 5.0): gen 0 was still the last to step, so B resolves to gen 1 as well... unless gen 1
    # stepped before B. Loss C at 6.2 hits gen 1 while it steps: it needs gen 2 (at 9.0).
    events = [
        _step(1.0, 0, 1),
        _step(2.0, 0, 2),
        _step(5.0, 1, 3),
        _step(6.0, 1, 4),
        _step(7.0, 1, 5),  # gen 1 steps on after C (the group has not noticed yet)
        _step(9.0, 2, 5),
        _step(10.0, 2, 6),
    ]
    a, b, c = sch.attribute([2.5, 4.0, 6.2], events)
    assert (a.gen_before, a.step and a.step["gen"], a.seconds) == (0, 1, pytest.approx(2.5))
    assert (b.gen_before, b.step and b.step["gen"], b.seconds) == (0, 1, pytest.approx(1.0))
    assert (c.gen_before, c.step and c.step["gen"], c.seconds) == (1, 2, pytest.approx(2.8))


def test_a_loss_without_a_later_generation_is_kept_as_not_recovered() -> None:
    events = [_step(1.0, 0, 1), _step(2.0, 0, 2), _step(3.0, 0, 3), _step(400.0, 1, 4)]
    first, late = sch.attribute([1.5, 2.5], events, timeout=300.0)
    assert first.step is None and first.seconds is None  # 398.5 s > the timeout
    assert late.step is None
    (none,) = sch.attribute([5.0], events[:3])
    assert none.step is None and none.gen_before == 0


def test_gen_at_reads_the_generation_that_was_stepping() -> None:
    steps = sch.rank0_steps([_step(2.0, 1, 2), _step(1.0, 0, 1), {"ev": "restored", "t": 1.5}])
    assert [e["step"] for e in steps] == [1, 2]
    assert sch.gen_at(steps, 0.5) == -1
    assert sch.gen_at(steps, 1.0) == 0
    assert sch.gen_at(steps, 1.9) == 0
    assert sch.gen_at(steps, 3.0) == 1


def test_realised_rate_and_the_end_of_a_row() -> None:
    assert sch.realised_rate(4, 200.0) == pytest.approx(0.02)
    assert sch.realised_rate(3, 0.0) == 0.0
    assert sch.end_of_row(100.0, [10.0, 50.0], 40.0) == pytest.approx(190.0)
    assert sch.end_of_row(100.0, [10.0, 50.0], 40.0, notice=30) == pytest.approx(220.0)
    assert sch.end_of_row(100.0, [], 40.0) == pytest.approx(140.0)
    assert [sch.notice_seconds(m) for m in ("notice30", "notice120", "vanish")] == [30, 120, 0]


@pytest.mark.parametrize(
    ("replicas", "modes", "nodes", "expected"),
    [
        (8, ["graceful", "hard"], 3, 7),  # a pod loss: one below the size
        (8, ["hard", "vanish"], 3, 5),  # a node of 3 holds at most 3 of 8 pods
        (8, ["notice30"], 4, 6),
        (8, ["vanish"], 1, 1),  # one node holds them all: never below 1
        (2, ["vanish"], 3, 1),
    ],
)
def test_default_min_replicas_survives_one_nodes_share(
    replicas: int, modes: list[str], nodes: int, expected: int
) -> None:
    assert sch.default_min_replicas(replicas, modes, nodes) == expected


def test_the_members_at_a_loss_are_those_of_the_last_generation_published_before_it() -> None:
    """A loss that takes only pods not in the group yet (a move's replacements starting on
    the node that vanished) took no member: the job trained on (2026-11-29j, loss 5: its
    'recovery' read 96.5 s, the time to the next, unrelated, generation)."""
    trace = [
        {"t": 1.0, "what": "job", "generation": 0, "members": None},
        {"t": 2.0, "what": "pod", "pod": "gp-worker-1"},
        {"t": 3.0, "what": "job", "generation": 1, "members": [0, 2, 5]},
        {"t": 9.0, "what": "job", "generation": 2, "members": [0, 2, 5, 11, 12]},
    ]
    assert sch.members_at(trace, 2.5, "gp") is None
    assert sch.members_at(trace, 3.0, "gp") == {"gp-worker-0", "gp-worker-2", "gp-worker-5"}
    assert sch.members_at(trace, 8.9, "gp") == {"gp-worker-0", "gp-worker-2", "gp-worker-5"}
    assert "gp-worker-12" in (sch.members_at(trace, 9.5, "gp") or set())
    assert sch.members_at([], 5.0, "gp") is None
