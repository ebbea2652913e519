"""GroupFailurePolicy and GroupScalingPolicy: pure decisions, table-driven."""

from __future__ import annotations

import signal

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

KILLED = WorkerFailure(
    rank=2, kind=FailureKind.DIED, message="killed by SIGKILL", signal=signal.SIGKILL
)
EXIT3 = WorkerFailure(rank=1, kind=FailureKind.DIED, message="exit code 3")
RAISED = WorkerFailure(rank=0, kind=FailureKind.ERROR, message="ValueError: x")
HUNG = WorkerFailure(rank=3, kind=FailureKind.TIMEOUT, message="collective timed out")


@pytest.mark.parametrize(
    ("policy", "state", "failure", "expected"),
    [
        pytest.param(
            GroupFailurePolicy(max_failures=0, min_workers=3, max_workers=3),
            RunState(num_workers=3),
            KILLED,
            Fail,
            id="fixed-no-budget-fails",
        ),
        pytest.param(
            GroupFailurePolicy(max_failures=2, min_workers=3, max_workers=3),
            RunState(num_workers=3, failures=1),
            KILLED,
            RestartGroup(num_workers=3, reason="", charged=True),
            id="fixed-kill-restarts-same-size-charged",
        ),
        pytest.param(
            GroupFailurePolicy(max_failures=2, min_workers=3, max_workers=3),
            RunState(num_workers=3, failures=2),
            RAISED,
            Fail,
            id="fixed-budget-spent",
        ),
        pytest.param(
            GroupFailurePolicy(max_failures=0, min_workers=2, max_workers=4),
            RunState(num_workers=4),
            KILLED,
            RestartGroup(num_workers=3, reason="", charged=False),
            id="elastic-kill-shrinks-uncharged",
        ),
        pytest.param(
            GroupFailurePolicy(max_failures=0, min_workers=2, max_workers=4),
            RunState(num_workers=2),
            KILLED,
            Fail,
            id="elastic-at-min-kill-is-charged",
        ),
        pytest.param(
            GroupFailurePolicy(max_failures=1, min_workers=2, max_workers=4),
            RunState(num_workers=4),
            EXIT3,
            RestartGroup(num_workers=4, reason="", charged=True),
            id="elastic-nonzero-exit-is-a-failure",
        ),
        pytest.param(
            GroupFailurePolicy(max_failures=None, min_workers=2, max_workers=2),
            RunState(num_workers=2, failures=1000),
            HUNG,
            RestartGroup(num_workers=2, reason="", charged=True),
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
    assert (decision.num_workers, decision.charged) == (expected.num_workers, expected.charged)
    assert f"rank {failure.rank}" in decision.reason


def test_failure_policy_is_deterministic() -> None:
    policy = GroupFailurePolicy(max_failures=1, min_workers=1, max_workers=1)
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
    decision = GroupScalingPolicy(min_workers=2, max_workers=4, grow_cooldown_s=10).decide_for(
        state, now_s=now, available_workers=available
    )
    assert type(decision) is type(expected)
    if isinstance(expected, Resize):
        assert isinstance(decision, Resize)
        assert decision.num_workers == expected.num_workers


def test_next_generation_counts() -> None:
    s0 = RunState(num_workers=4, checkpoints_in_generation=3)
    s1 = next_generation(s0, 3, charged=False, now_s=5.0)
    assert (s1.generation, s1.failures, s1.disruptions, s1.checkpoints_in_generation) == (
        1,
        0,
        1,
        0,
    )
    s2 = next_generation(s1, 3, charged=True, now_s=6.0)
    assert (s2.generation, s2.failures, s2.disruptions, s2.generation_started_s) == (2, 1, 1, 6.0)
