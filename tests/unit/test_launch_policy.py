"""GroupFailurePolicy and GroupScalingPolicy: pure decisions over ``torchjob.rules``,
table-driven. A worker killed from outside (no OOM evidence) is a disruption, never charged,
in a fixed-size group too; an OOM kill, an exception, an exit or a hang is charged."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from torchjob.launch.policy import (
    Fail,
    FailureKind,
    GroupFailurePolicy,
    GroupScalingPolicy,
    Noop,
    Resize,
    RestartGroup,
    RunState,
    WorkerFailure,
    next_generation,
)
from torchjob.rules import Counters, ElasticRules


def fixed(max_failures: int | None, n: int) -> GroupFailurePolicy:
    return GroupFailurePolicy(max_failures, ElasticRules(floor=n, ceiling=n))


def elastic(max_failures: int | None, lo: int, hi: int) -> GroupFailurePolicy:
    return GroupFailurePolicy(max_failures, ElasticRules(floor=lo, ceiling=hi))


KILLED = WorkerFailure(
    rank=2, kind=FailureKind.DIED, message="killed by SIGKILL", signal=signal.SIGKILL
)
OOM = WorkerFailure(
    rank=2, kind=FailureKind.DIED, message="killed by SIGKILL", signal=signal.SIGKILL, oom=True
)
EXIT3 = WorkerFailure(rank=1, kind=FailureKind.DIED, message="exit code 3", exit_code=3)
RAISED = WorkerFailure(rank=0, kind=FailureKind.ERROR, message="ValueError: x")
HUNG = WorkerFailure(rank=3, kind=FailureKind.TIMEOUT, message="collective timed out")


@pytest.mark.parametrize(
    ("policy", "state", "failure", "expected"),
    [
        pytest.param(
            fixed(0, 3),
            RunState(num_workers=3),
            OOM,
            Fail,
            id="fixed-no-budget-oom-fails",
        ),
        pytest.param(
            fixed(0, 3),
            RunState(num_workers=3),
            KILLED,
            RestartGroup(num_workers=3, reason="", charged=False, counters=Counters(1, 0, 1)),
            id="fixed-kill-restarts-same-size-uncharged",
        ),
        pytest.param(
            fixed(2, 3),
            RunState(num_workers=3, failures=1),
            OOM,
            RestartGroup(num_workers=3, reason="", charged=True, counters=Counters(1, 2, 0)),
            id="fixed-oom-restarts-same-size-charged",
        ),
        pytest.param(
            fixed(2, 3),
            RunState(num_workers=3, failures=2),
            RAISED,
            Fail,
            id="fixed-budget-spent",
        ),
        pytest.param(
            elastic(0, 2, 4),
            RunState(num_workers=4),
            KILLED,
            RestartGroup(num_workers=3, reason="", charged=False, counters=Counters(1, 0, 1)),
            id="elastic-kill-shrinks-uncharged",
        ),
        pytest.param(
            elastic(0, 2, 4),
            RunState(num_workers=2),
            KILLED,
            RestartGroup(num_workers=2, reason="", charged=False, counters=Counters(1, 0, 1)),
            id="elastic-at-min-kill-keeps-the-size-uncharged",
        ),
        pytest.param(
            elastic(1, 2, 4),
            RunState(num_workers=4),
            EXIT3,
            RestartGroup(num_workers=4, reason="", charged=True, counters=Counters(1, 1, 0)),
            id="elastic-nonzero-exit-is-a-failure",
        ),
        pytest.param(
            elastic(1, 2, 4),
            RunState(num_workers=4),
            OOM,
            RestartGroup(num_workers=4, reason="", charged=True, counters=Counters(1, 1, 0)),
            id="elastic-oom-is-a-failure-at-full-size-without-memory",
        ),
        pytest.param(
            elastic(1, 2, 4),
            RunState(num_workers=4, survivors_hold_state=True),
            OOM,
            RestartGroup(
                num_workers=3, reason="", charged=True, counters=Counters(1, 1, 0), from_memory=True
            ),
            id="elastic-oom-shrinks-in-place-charged-from-memory",
        ),
        pytest.param(
            fixed(None, 2),
            RunState(num_workers=2, failures=1000),
            HUNG,
            RestartGroup(num_workers=2, reason="", charged=True, counters=Counters(1, 1001, 0)),
            id="unlimited-budget",
        ),
    ],
)
def test_failure_policy(
    policy: GroupFailurePolicy, state: RunState, failure: WorkerFailure, expected: object
) -> None:
    decision = policy.decide(state, failure)
    if expected is Fail:
        assert isinstance(decision, Fail)
        assert f"rank {failure.rank}" in decision.reason
        assert "max_failures" in decision.reason
        return
    assert isinstance(decision, RestartGroup) and isinstance(expected, RestartGroup)
    assert replace(decision, reason="") == expected, "the decision's counters, kept as they are"
    assert f"rank {failure.rank}" in decision.reason


def test_failure_policy_is_deterministic() -> None:
    policy = fixed(1, 1)
    state = RunState(num_workers=1)
    assert policy.decide(state, RAISED) == policy.decide(state, RAISED)


@pytest.mark.parametrize(
    ("state", "now", "available", "expected"),
    [
        pytest.param(RunState(num_workers=4), 100.0, 4, Noop(), id="at-max"),
        pytest.param(RunState(num_workers=3), 100.0, 4, Noop(), id="no-checkpoint-yet"),
        pytest.param(
            RunState(num_workers=3, checkpoints_in_generation=1, generation_started_s=95.0),
            100.0,
            4,
            Noop(),
            id="cooldown",
        ),
        pytest.param(
            RunState(num_workers=3, checkpoints_in_generation=1, generation_started_s=80.0),
            100.0,
            4,
            Resize(num_workers=4, reason=""),
            id="grows-back",
        ),
        pytest.param(
            RunState(num_workers=2, checkpoints_in_generation=2, generation_started_s=0.0),
            100.0,
            3,
            Resize(num_workers=3, reason=""),
            id="grows-to-available",
        ),
        pytest.param(
            RunState(num_workers=3, checkpoints_in_generation=2), 100.0, 3, Noop(), id="no-capacity"
        ),
    ],
)
def test_scaling_policy(state: RunState, now: float, available: int, expected: object) -> None:
    rules = ElasticRules(floor=2, ceiling=4, grow_cooldown_s=10)
    decision = GroupScalingPolicy(rules).decide_for(state, now_s=now, available_workers=available)
    assert type(decision) is type(expected)
    if isinstance(expected, Resize):
        assert isinstance(decision, Resize)
        assert decision.num_workers == expected.num_workers


def test_next_generation_adopts_the_decisions_counters() -> None:
    s0 = RunState(num_workers=4, checkpoints_in_generation=3)
    shrink = elastic(0, 2, 4).decide(s0, KILLED)
    assert isinstance(shrink, RestartGroup)
    s1 = next_generation(s0, shrink.num_workers, shrink.counters, now_s=5.0)
    assert (s1.generation, s1.failures, s1.disruptions, s1.checkpoints_in_generation) == (
        1,
        0,
        1,
        0,
    )
    s2 = next_generation(s1, 3, Counters(2, 1, 1), now_s=6.0)
    assert (s2.generation, s2.failures, s2.disruptions, s2.generation_started_s) == (2, 1, 1, 6.0)
    grown = next_generation(s2, 4, s2.counters.resized(), now_s=7.0)
    assert grown.counters == Counters(3, 1, 1)
