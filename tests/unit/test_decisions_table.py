"""One table of scenarios for the one set of job rules (``torchjob.rules``).

The operator's planner, ``torchjob run``, TorchTrainer's controller and
``PyTorchTrainer.train`` all decide what follows a generation with the same functions:
the deadline (``deadline_left``), the judgement (``judge_generation``) and the decision
after a lost generation (``decide_restart``, over plain ``RestartRules``). Each scenario
is written once, as what happened to the workers of a running generation, and played
through those functions; the verdict is asserted.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from torchjob.api.models import FailurePolicy
from torchjob.client.local import LocalMember
from torchjob.launch.policy import RunState, next_generation
from torchjob.rules import (
    Counters,
    MemberPhase,
    Outcome,
    Recovery,
    RestartRules,
    Verdict,
    deadline_left,
    decide_restart,
    judge_generation,
    killed_from_outside,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
POLICY = {"maxRestarts": 3, "backoff": {"initialSeconds": 10, "factor": 2.0, "maxSeconds": 300}}


def worker(i: int, w: str) -> LocalMember:
    """Per worker: "run", "ok", "exit:<code>", "preempted" (a ``torchjob.rules.Member``)."""
    done = T0 + timedelta(seconds=5)
    if w == "ok":
        return LocalMember(f"w{i}", i, MemberPhase.SUCCEEDED, 0, "Completed", finished_at=done)
    if w == "preempted":
        return LocalMember(f"w{i}", i, MemberPhase.FAILED, 143, "Error", "preempted", done)
    if w.startswith("exit:"):
        code = int(w.split(":")[1])
        return LocalMember(f"w{i}", i, MemberPhase.FAILED, code, "Error", finished_at=done)
    return LocalMember(f"w{i}", i)


@dataclass(frozen=True)
class Scenario:
    workers: tuple[str, ...]
    restarts: int = 0
    policy: tuple[tuple[str, Any], ...] = ()
    deadline_s: int | None = None
    now_s: float = 60.0


@dataclass(frozen=True)
class Expected:
    verdict: str
    """A ``Verdict`` value, or "succeed", "continue", "deadline"."""
    counters: Counters
    backoff_s: float = 0.0


SCENARIOS = {
    "failure": (
        Scenario(("run", "exit:1")),
        Expected(Verdict.RESTART_GROUP, Counters(1, 1, 0), 10.0),
    ),
    "second-failure-backs-off-longer": (
        Scenario(("exit:1", "run"), restarts=1),
        Expected(Verdict.RESTART_GROUP, Counters(1, 2, 0), 20.0),
    ),
    "permanent-code": (
        Scenario(("run", "exit:42"), policy=(("permanentExitCodes", [42]),)),
        Expected(Verdict.FAIL_PERMANENT, Counters(0, 0, 0)),
    ),
    "outside-retryable": (
        Scenario(("run", "exit:3"), policy=(("retryableExitCodes", [1, 2]),)),
        Expected(Verdict.FAIL_PERMANENT, Counters(0, 0, 0)),
    ),
    "budget-spent": (
        Scenario(("exit:1", "run"), restarts=3),
        Expected(Verdict.FAIL_BUDGET_EXHAUSTED, Counters(0, 3, 0)),
    ),
    "preemption": (
        Scenario(("run", "preempted")),
        Expected(Verdict.DISRUPTED, Counters(1, 0, 1)),
    ),
    "preemption-beats-a-peer-failure": (
        Scenario(("exit:1", "preempted")),
        Expected(Verdict.DISRUPTED, Counters(1, 0, 1)),
    ),
    "success": (
        Scenario(("ok", "ok")),
        Expected("succeed", Counters(0, 0, 0)),
    ),
    "still-running": (
        Scenario(("ok", "run")),
        Expected("continue", Counters(0, 0, 0)),
    ),
    "deadline": (
        Scenario(("run", "run"), now_s=100.0, deadline_s=30),
        Expected("deadline", Counters(0, 0, 0)),
    ),
}


def play(s: Scenario) -> Expected:
    counters = Counters(restarts=s.restarts)
    left = deadline_left(s.deadline_s, T0, T0 + timedelta(seconds=s.now_s))
    if left is not None and left <= 0:
        return Expected("deadline", counters)
    members = [worker(i, w) for i, w in enumerate(s.workers)]
    j = judge_generation(members, replicas=len(members))
    if j.outcome is Outcome.SUCCEEDED:
        return Expected("succeed", counters)
    if j.outcome not in (Outcome.DISRUPTED, Outcome.FAILED):
        return Expected("continue", counters)
    d = decide_restart(
        counters,
        RestartRules.of(FailurePolicy.model_validate({**POLICY, **dict(s.policy)})),
        disrupted=j.outcome is Outcome.DISRUPTED,
        workers=len(members),
        exit_code=None if j.culprit is None else j.culprit.exit_code,
    )
    assert d.workers == len(members)
    assert d.restarts is (d.verdict in (Verdict.RESTART_GROUP, Verdict.DISRUPTED))
    assert d.charged is (d.verdict is Verdict.RESTART_GROUP)
    return Expected(d.verdict, d.counters, d.backoff_s)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_job_rules_reach_the_verdict(name: str) -> None:
    scenario, expected = SCENARIOS[name]
    assert play(scenario) == expected


@pytest.mark.parametrize(
    ("workers", "floor", "disrupted", "max_restarts", "restarts", "expected"),
    [
        pytest.param(4, 2, True, 0, 0, (Verdict.DISRUPTED, 3, Counters(1, 0, 1)), id="shrinks"),
        pytest.param(
            2, 2, True, 0, 0, (Verdict.FAIL_BUDGET_EXHAUSTED, 2, Counters(0, 0, 0)), id="at-floor"
        ),
        pytest.param(
            2, 2, True, 1, 0, (Verdict.RESTART_GROUP, 2, Counters(1, 1, 0)), id="at-floor-charged"
        ),
        pytest.param(
            4,
            2,
            False,
            1,
            0,
            (Verdict.RESTART_GROUP, 4, Counters(1, 1, 0)),
            id="failure-keeps-size",
        ),
        pytest.param(
            2,
            None,
            False,
            None,
            1000,
            (Verdict.RESTART_GROUP, 2, Counters(1, 1001, 0)),
            id="no-limit",
        ),
    ],
)
def test_a_disruption_shrinks_down_to_the_floor_then_is_charged(
    workers: int,
    floor: int | None,
    disrupted: bool,
    max_restarts: int | None,
    restarts: int,
    expected: tuple[Verdict, int, Counters],
) -> None:
    d = decide_restart(
        Counters(restarts=restarts),
        RestartRules(max_restarts=max_restarts),
        disrupted=disrupted,
        workers=workers,
        shrink_floor=floor,
    )
    assert (d.verdict, d.workers, d.counters) == expected
    assert d.backoff_s == 0.0


def test_permanent_overrides_the_exit_code_classes() -> None:
    rules = RestartRules(max_restarts=1, permanent_exit_codes=frozenset({1}))
    retried = decide_restart(
        Counters(), rules, disrupted=False, workers=1, exit_code=1, permanent=False
    )
    assert retried.verdict is Verdict.RESTART_GROUP
    failed = decide_restart(Counters(), rules, disrupted=False, workers=1, permanent=True)
    assert failed.verdict is Verdict.FAIL_PERMANENT and failed.counters == Counters()


def test_restart_rules_of_a_failure_policy() -> None:
    rules = RestartRules.of(
        FailurePolicy.model_validate(
            {**POLICY, "permanentExitCodes": [42], "retryableExitCodes": [1]}
        )
    )
    assert rules == RestartRules(
        max_restarts=3,
        backoff_initial_s=10,
        backoff_factor=2.0,
        backoff_max_s=300,
        permanent_exit_codes=frozenset({42}),
        retryable_exit_codes=frozenset({1}),
    )


@pytest.mark.parametrize(
    ("sig", "killed"),
    [
        (signal.SIGKILL, True),
        (signal.SIGTERM, True),
        (signal.SIGINT, True),
        (signal.SIGHUP, True),
        (signal.SIGSEGV, False),
        (signal.SIGABRT, False),
        (None, False),
    ],
)
def test_killed_from_outside(sig: int | None, killed: bool) -> None:
    assert killed_from_outside(sig) is killed


def test_a_grow_starts_a_generation_charged_to_no_counter() -> None:
    # TorchTrainer: an elastic group grows back from 2 to 3 workers.
    s = next_generation(
        RunState(num_workers=2, failures=1, disruptions=1), 3, charged=False, now_s=1.0
    )
    assert s.counters == Counters(0, 1, 1).resized() == Counters(1, 1, 1)


HARD_LOSS_RULES = RestartRules(
    max_restarts=3, backoff_initial_s=10, backoff_factor=2.0, backoff_max_s=300
)


@pytest.mark.parametrize(
    ("killed", "held", "floor", "restarts", "expected"),
    [
        # SIGKILL (or the OOM killer) of one rank while the survivors hold the last step:
        # charged as the policy says, but in place from memory and at once.
        pytest.param(
            True,
            True,
            None,
            1,
            (Verdict.RESTART_GROUP, 4, Counters(1, 2, 0), 0.0, Recovery.MEMORY),
            id="killed-survivors-hold-state",
        ),
        # The same kill with nothing in memory (no state registered): storage, with backoff.
        pytest.param(
            True,
            False,
            None,
            1,
            (Verdict.RESTART_GROUP, 4, Counters(1, 2, 0), 20.0, Recovery.STORAGE),
            id="killed-nothing-in-memory",
        ),
        # A rank's own exception: the survivors' memory is the restore point, but a crash
        # loop is still paced by the backoff.
        pytest.param(
            False,
            True,
            None,
            0,
            (Verdict.RESTART_GROUP, 4, Counters(1, 1, 0), 10.0, Recovery.MEMORY),
            id="exception-keeps-its-backoff",
        ),
        # The budget still ends the job, memory or not.
        pytest.param(
            True,
            True,
            None,
            3,
            (Verdict.FAIL_BUDGET_EXHAUSTED, 4, Counters(0, 3, 0), 0.0, Recovery.MEMORY),
            id="budget-spent-even-in-memory",
        ),
    ],
)
def test_a_hard_loss_restores_from_the_survivors_memory(
    killed: bool,
    held: bool,
    floor: int | None,
    restarts: int,
    expected: tuple[Verdict, int, Counters, float, Recovery],
) -> None:
    d = decide_restart(
        Counters(restarts=restarts),
        HARD_LOSS_RULES,
        disrupted=False,
        workers=4,
        shrink_floor=floor,
        survivors_hold_state=held,
        killed=killed,
    )
    assert (d.verdict, d.workers, d.counters, d.backoff_s, d.recovery) == expected


def test_an_elastic_kill_shrinks_in_place_from_memory() -> None:
    # TorchTrainer num_workers=(2, 4): a SIGKILLed rank is a disruption, the 3 survivors
    # go on from their memory, nothing charged.
    d = decide_restart(
        Counters(),
        HARD_LOSS_RULES,
        disrupted=True,
        workers=4,
        shrink_floor=2,
        survivors_hold_state=True,
        killed=True,
    )
    assert (d.verdict, d.workers, d.counters, d.backoff_s, d.recovery) == (
        Verdict.DISRUPTED,
        3,
        Counters(1, 0, 1),
        0.0,
        Recovery.MEMORY,
    )


def test_the_group_policy_restores_a_killed_rank_from_memory() -> None:
    from torchjob.launch.policy import FailureKind, GroupFailurePolicy, RestartGroup, WorkerFailure

    policy = GroupFailurePolicy(max_failures=2, min_workers=4, max_workers=4)
    kill = WorkerFailure(2, FailureKind.DIED, "killed by SIGKILL", signal.SIGKILL)
    held = policy.decide(RunState(num_workers=4, survivors_hold_state=True), kill)
    assert held == RestartGroup(4, held.reason, charged=True, from_memory=True)
    assert "memory" in held.reason
    cold = policy.decide(RunState(num_workers=4), kill)
    assert isinstance(cold, RestartGroup) and not cold.from_memory
    after = next_generation(RunState(4, survivors_hold_state=True), 4, charged=True, now_s=0)
    assert not after.survivors_hold_state  # the next generation's reports say it again
