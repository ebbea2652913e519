"""One table of scenarios for the one set of job rules (``torchjob.rules``).

The operator's planner, ``torchjob run``, TorchTrainer's controller and
``PyTorchTrainer.train`` all decide what follows a generation with the same functions:
the deadline (``deadline_left``), the one loss model (``classify``), the judgement
(``judge_generation``) and the decision after a lost generation (``decide_restart``, over
plain ``RestartRules`` and ``ElasticRules``). Each scenario is written once, as what
happened to the workers of a running generation, and played through those functions; the
verdict is asserted. ``LOSSES`` plays each loss through every launcher's own decision path
(the operator's pure ``plan``, ``torchjob run``'s ``decide``, the local group's
``GroupFailurePolicy``) and asserts that they agree.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from torchjob import contract
from torchjob.api.models import FailurePolicy
from torchjob.client.local import LocalMember
from torchjob.launch.policy import RunState, next_generation
from torchjob.rules import (
    Counters,
    Disruption,
    ElasticRules,
    Failure,
    MemberPhase,
    Outcome,
    Recovery,
    RestartRules,
    Silent,
    Stopped,
    Verdict,
    classify,
    deadline_left,
    decide_restart,
    judge_generation,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
KILL = Disruption("killed by SIGKILL")
OOM = Failure(137, signal.SIGKILL, oom=True)
EXIT1 = Failure(1)

POLICY = {"maxRestarts": 3, "backoff": {"initialSeconds": 10, "factor": 2.0, "maxSeconds": 300}}


def worker(i: int, w: str) -> LocalMember:
    """Per worker: "run", "ok", "exit:<code>", "preempted" (a ``torchjob.rules.Member``)."""
    done = T0 + timedelta(seconds=5)
    if w == "ok":
        return LocalMember(f"w{i}", i, MemberPhase.SUCCEEDED, 0, "Completed", finished_at=done)
    if w == "preempted":
        return LocalMember(
            f"w{i}", i, MemberPhase.FAILED, 143, "Error", finished_at=done, taken="preempted"
        )
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
    assert j.loss is not None
    d = decide_restart(
        counters,
        RestartRules.of(FailurePolicy.model_validate({**POLICY, **dict(s.policy)})),
        j.loss,
        workers=len(members),
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
    ("workers", "floor", "loss", "max_restarts", "restarts", "expected"),
    [
        pytest.param(4, 2, KILL, 0, 0, (Verdict.DISRUPTED, 3, Counters(1, 0, 1)), id="shrinks"),
        pytest.param(
            2, 2, KILL, 0, 0, (Verdict.DISRUPTED, 2, Counters(1, 0, 1)), id="at-floor-keeps-size"
        ),
        pytest.param(
            4,
            2,
            EXIT1,
            1,
            0,
            (Verdict.RESTART_GROUP, 4, Counters(1, 1, 0)),
            id="failure-keeps-size",
        ),
        pytest.param(
            2,
            None,
            EXIT1,
            None,
            1000,
            (Verdict.RESTART_GROUP, 2, Counters(1, 1001, 0)),
            id="no-limit",
        ),
    ],
)
def test_a_disruption_shrinks_down_to_the_floor_then_keeps_the_size(
    workers: int,
    floor: int | None,
    loss: Disruption | Failure,
    max_restarts: int | None,
    restarts: int,
    expected: tuple[Verdict, int, Counters],
) -> None:
    d = decide_restart(
        Counters(restarts=restarts),
        RestartRules(max_restarts=max_restarts),
        loss,
        workers=workers,
        elastic=None if floor is None else ElasticRules(floor=floor, ceiling=workers + 1),
    )
    assert (d.verdict, d.workers, d.counters) == expected
    assert d.backoff_s == 0.0


def test_permanent_overrides_the_exit_code_classes() -> None:
    rules = RestartRules(max_restarts=1, permanent_exit_codes=frozenset({1}))
    retried = decide_restart(Counters(), rules, Failure(1, permanent=False), workers=1)
    assert retried.verdict is Verdict.RESTART_GROUP
    failed = decide_restart(Counters(), rules, Failure(None, permanent=True), workers=1)
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
    ("seen", "loss"),
    [
        (dict(signal=signal.SIGKILL), Disruption("killed by SIGKILL")),
        (dict(signal=signal.SIGTERM), Disruption("killed by SIGTERM")),
        (dict(signal=signal.SIGINT), Disruption("killed by SIGINT")),
        (dict(signal=signal.SIGHUP), Disruption("killed by SIGHUP")),
        (dict(signal=signal.SIGKILL, oom=True), Failure(None, signal.SIGKILL, oom=True)),
        (dict(exit_code=137, oom=True), Failure(137, oom=True)),
        (dict(signal=signal.SIGSEGV), Failure(None, signal.SIGSEGV)),
        (dict(signal=signal.SIGABRT), Failure(None, signal.SIGABRT)),
        (dict(exit_code=1), Failure(1)),
        (dict(exit_code=contract.STOPPED_EXIT_CODE), Stopped()),
        (dict(exit_code=1, taken="EvictionByEvictionAPI"), Disruption("EvictionByEvictionAPI")),
        (dict(silent=Silent(12.0, "w0")), Silent(12.0, "w0")),
    ],
)
def test_the_one_classifier(seen: dict[str, Any], loss: object) -> None:
    assert classify(ended=True, **seen) == loss


def test_a_running_or_succeeded_worker_is_no_loss() -> None:
    assert classify(ended=False, exit_code=None) is None
    assert classify(ended=False, taken="PreemptionByScheduler") == Disruption(
        "PreemptionByScheduler"
    )


def test_a_grow_starts_a_generation_charged_to_no_counter() -> None:
    # TorchTrainer: an elastic group grows back from 2 to 3 workers.
    state = RunState(num_workers=2, failures=1, disruptions=1)
    s = next_generation(state, 3, state.counters.resized(), now_s=1.0)
    assert s.counters == Counters(0, 1, 1).resized() == Counters(1, 1, 1)


HARD_LOSS_RULES = RestartRules(
    max_restarts=3, backoff_initial_s=10, backoff_factor=2.0, backoff_max_s=300
)


@pytest.mark.parametrize(
    ("loss", "held", "restarts", "expected"),
    [
        # The OOM killer's SIGKILL of one rank while the survivors hold the last step:
        # charged as the policy says, but in place from memory and at once.
        pytest.param(
            OOM,
            True,
            1,
            (Verdict.RESTART_GROUP, 4, Counters(1, 2, 0), 0.0, Recovery.MEMORY),
            id="oom-survivors-hold-state",
        ),
        # The same kill with nothing in memory (no state registered): storage, with backoff.
        pytest.param(
            OOM,
            False,
            1,
            (Verdict.RESTART_GROUP, 4, Counters(1, 2, 0), 20.0, Recovery.STORAGE),
            id="oom-nothing-in-memory",
        ),
        # A SIGKILL with no OOM evidence: not charged, at once.
        pytest.param(
            KILL,
            True,
            1,
            (Verdict.DISRUPTED, 4, Counters(1, 1, 1), 0.0, Recovery.MEMORY),
            id="kill-is-a-disruption",
        ),
        # A rank's own exception: the survivors' memory is the restore point, but a crash
        # loop is still paced by the backoff.
        pytest.param(
            EXIT1,
            True,
            0,
            (Verdict.RESTART_GROUP, 4, Counters(1, 1, 0), 10.0, Recovery.MEMORY),
            id="exception-keeps-its-backoff",
        ),
        # The budget still ends the job, memory or not.
        pytest.param(
            OOM,
            True,
            3,
            (Verdict.FAIL_BUDGET_EXHAUSTED, 4, Counters(0, 3, 0), 0.0, Recovery.MEMORY),
            id="budget-spent-even-in-memory",
        ),
    ],
)
def test_a_hard_loss_restores_from_the_survivors_memory(
    loss: Failure | Disruption,
    held: bool,
    restarts: int,
    expected: tuple[Verdict, int, Counters, float, Recovery],
) -> None:
    d = decide_restart(
        Counters(restarts=restarts),
        HARD_LOSS_RULES,
        loss,
        workers=4,
        survivors_hold_state=held,
    )
    assert (d.verdict, d.workers, d.counters, d.backoff_s, d.recovery) == expected


def test_an_elastic_kill_shrinks_in_place_from_memory() -> None:
    # TorchTrainer num_workers=(2, 4): a SIGKILLed rank is a disruption, the 3 survivors
    # go on from their memory, nothing charged.
    d = decide_restart(
        Counters(),
        HARD_LOSS_RULES,
        KILL,
        workers=4,
        elastic=ElasticRules(floor=2, ceiling=4),
        survivors_hold_state=True,
    )
    assert (d.verdict, d.workers, d.counters, d.backoff_s, d.recovery, d.shrunk) == (
        Verdict.DISRUPTED,
        3,
        Counters(1, 0, 1),
        0.0,
        Recovery.MEMORY,
        True,
    )


def test_the_group_policy_restores_an_oom_killed_rank_from_memory() -> None:
    from torchjob.launch.policy import FailureKind, GroupFailurePolicy, RestartGroup, WorkerFailure

    policy = GroupFailurePolicy(2, ElasticRules(floor=4, ceiling=4))
    oom = WorkerFailure(2, FailureKind.DIED, "killed by SIGKILL", signal.SIGKILL, oom=True)
    held = policy.decide(RunState(num_workers=4, survivors_hold_state=True), oom)
    assert held == RestartGroup(
        4, held.reason, charged=True, counters=Counters(1, 1, 0), from_memory=True
    )
    assert "memory" in held.reason
    cold = policy.decide(RunState(num_workers=4), oom)
    assert isinstance(cold, RestartGroup) and not cold.from_memory
    state = RunState(4, survivors_hold_state=True)
    after = next_generation(state, 4, held.counters, now_s=0)
    assert not after.survivors_hold_state  # the next generation's reports say it again


# --- every loss through every launcher's own decision path --------------------------------
#
# A loss is written once (what happened to worker 1 of a running generation) and played
# through the operator's pure ``plan`` (pods and the job's status), ``torchjob run``'s
# ``decide`` (local processes: a return code, the OOM killer's evidence, a termination
# message) and the local group's ``GroupFailurePolicy`` (a worker process's death). Each path
# that can observe the loss must reach the same verdict, counters and size.


@dataclass(frozen=True)
class Lost:
    how: str
    """"kill" (SIGKILL, no OOM evidence), "oom", "silent", "evicted", "stopped", "exit"."""
    code: int = 1
    restarts: int = 0
    policy: tuple[tuple[str, Any], ...] = ()
    elastic: tuple[int, int] | None = None
    """(min, replicas): an elastic KeepSurvivors job / local group that shrinks on a loss."""
    replicas: int = 2


@dataclass(frozen=True)
class Agreed:
    verdict: str
    """"disrupted", "charged", "PermanentFailure", "RestartLimitExceeded"."""
    counters: Counters
    workers: int


LOSSES = {
    "kill": (Lost("kill"), Agreed("disrupted", Counters(1, 0, 1), 2)),
    "oom": (Lost("oom"), Agreed("charged", Counters(1, 1, 0), 2)),
    "silent": (Lost("silent"), Agreed("disrupted", Counters(1, 0, 1), 2)),
    "eviction": (Lost("evicted"), Agreed("disrupted", Counters(1, 0, 1), 2)),
    "stop": (Lost("stopped"), Agreed("disrupted", Counters(1, 0, 1), 2)),
    "exit": (Lost("exit"), Agreed("charged", Counters(1, 1, 0), 2)),
    "permanent-exit": (
        Lost("exit", code=42, policy=(("permanentExitCodes", [42]),)),
        Agreed("PermanentFailure", Counters(0, 0, 0), 2),
    ),
    "permanent-oom": (
        Lost("oom", policy=(("permanentExitCodes", [137]),)),
        Agreed("PermanentFailure", Counters(0, 0, 0), 2),
    ),
    "a-kill-never-spends-the-budget": (
        Lost("kill", restarts=3),
        Agreed("disrupted", Counters(1, 3, 1), 2),
    ),
    "budget-spent": (Lost("oom", restarts=3), Agreed("RestartLimitExceeded", Counters(0, 3, 0), 2)),
    "elastic-kill-shrinks": (
        Lost("kill", elastic=(1, 2)),
        Agreed("disrupted", Counters(1, 0, 1), 1),
    ),
    "elastic-silent-shrinks": (
        Lost("silent", elastic=(1, 2)),
        Agreed("disrupted", Counters(1, 0, 1), 1),
    ),
    "elastic-oom-shrinks-charged-from-memory": (
        Lost("oom", elastic=(1, 2)),
        Agreed("charged", Counters(1, 1, 0), 1),
    ),
    "elastic-exception-keeps-the-size": (
        Lost("exit", elastic=(1, 2)),
        Agreed("charged", Counters(1, 1, 0), 2),
    ),
    "elastic-at-the-floor-replaces": (
        Lost("kill", elastic=(3, 3), replicas=3),
        Agreed("disrupted", Counters(1, 0, 1), 3),
    ),
}


def _policy(lost: Lost) -> dict[str, Any]:
    return {**POLICY, **dict(lost.policy)}


def through_the_operator(lost: Lost) -> Agreed:
    """The operator's pure planner, over pods and the job's status."""
    from dataclasses import replace as _replace

    from tests.unit.builders import at, failed, job, preempted, running
    from tests.unit.test_planner import step

    from torchjob_operator.torchjob.plan import plan, with_state

    builder = job().replicas(lost.replicas)
    builder.spec["failurePolicy"] = _policy(lost)
    if lost.elastic is not None:
        builder = builder.keep_survivors()
        lo, hi = lost.elastic
        builder.spec["elastic"] = {"minReplicas": lo, "maxReplicas": hi, "shrinkOnDisruption": True}
    _, view, pods = step(builder.build(), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    status = {**settled.status, "restarts": lost.restarts}
    victim = up[1]
    match lost.how:
        case "kill":
            victim = failed(victim, 137, at_s=5)
        case "oom":
            victim = _replace(failed(victim, 137, at_s=5), reason="OOMKilled")
        case "evicted":
            victim = preempted(victim)
        case "stopped":
            victim = failed(victim, contract.STOPPED_EXIT_CODE, at_s=5)
        case "exit":
            victim = failed(victim, lost.code, at_s=5)
        case "silent":
            report = {"pod": victim.name, "generation": 0, "by": up[0].name, "seconds": 9.0}
            status["silentWorkers"] = [report]
    decided = plan(with_state(view, status), [up[0], victim, *up[2:]], at(6))
    st = decided.status
    counters = Counters(st["currentGeneration"], st["restarts"], st.get("disruptions") or 0)
    if st["phase"] == "Failed":
        reason = next(c["reason"] for c in st["conditions"] if c["type"] == "Failed")
        return Agreed(reason, counters, st["replicas"])
    charged = st["restarts"] > lost.restarts
    return Agreed("charged" if charged else "disrupted", counters, st["replicas"])


def through_torchjob_run(lost: Lost) -> Agreed | None:
    """``torchjob run``'s decision over local processes (no elastic, no silent reports)."""
    from torchjob.client.local import decide, process_member

    if lost.elastic is not None or lost.how == "silent":
        return None
    rc = {"kill": -9, "oom": -9, "stopped": contract.STOPPED_EXIT_CODE, "exit": lost.code}
    done = T0 + timedelta(seconds=5)
    if lost.how == "evicted":
        victim = LocalMember("tj-worker-1", 1, MemberPhase.FAILED, 143, finished_at=done, taken="x")
    else:
        victim = process_member("tj", 1, rc[lost.how], done, oom=lost.how == "oom")
    members = [
        process_member("tj", 0, None),
        victim,
        *[process_member("tj", i, None) for i in range(2, lost.replicas)],
    ]
    rules = RestartRules.of(FailurePolicy.model_validate(_policy(lost)))
    d = decide(rules, None, Counters(restarts=lost.restarts), members, start_time=T0, now=done)
    if d.action == "fail":
        return Agreed(d.reason, d.counters, lost.replicas)
    assert d.action == "restart"
    return Agreed(
        "charged" if d.reason == "WorkerFailed" else "disrupted", d.counters, lost.replicas
    )


def through_the_local_group(lost: Lost) -> Agreed | None:
    """TorchTrainer's local group: a worker process died (its driver kills a silent rank with
    SIGKILL); no exit-code classes, no backoff; the survivors hold the last step."""
    from torchjob.launch.policy import Fail, FailureKind, GroupFailurePolicy, WorkerFailure

    if lost.how in ("evicted", "stopped") or lost.policy:
        return None
    lo, hi = lost.elastic or (lost.replicas, lost.replicas)
    elastic = ElasticRules(floor=lo, ceiling=hi)
    policy = GroupFailurePolicy(_policy(lost)["maxRestarts"], elastic)
    killed = lost.how in ("kill", "silent", "oom")
    failure = WorkerFailure(
        1,
        FailureKind.DIED,
        "died",
        signal=signal.SIGKILL if killed else None,
        exit_code=None if killed else lost.code,
        oom=lost.how == "oom",
    )
    held = lost.elastic is not None  # as under KeepSurvivors: the survivors hold the step
    state = RunState(num_workers=lost.replicas, failures=lost.restarts, survivors_hold_state=held)
    d = policy.decide(state, failure)
    if isinstance(d, Fail):
        return Agreed("RestartLimitExceeded", state.counters, lost.replicas)
    return Agreed("charged" if d.charged else "disrupted", d.counters, d.num_workers)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_launcher_agrees_on_what_a_loss_costs(name: str) -> None:
    lost, expected = LOSSES[name]
    operator = through_the_operator(lost)
    assert operator == expected, "the operator"
    run = through_torchjob_run(lost)
    assert run in (None, expected), "torchjob run"
    group = through_the_local_group(lost)
    assert group in (None, expected), "the local worker group"
    assert (run, group) != (None, None) or lost.how == "evicted", "played by one launcher only"


@pytest.mark.parametrize("checkpoint", [True, False])
def test_every_launcher_grows_back_only_after_a_checkpoint_in_the_generation(
    checkpoint: bool,
) -> None:
    """An elastic group shrunk to 1 of 2, with capacity back and the cooldown over: the
    operator (a RecreateGroup job with ``spec.checkpoint``, its probes placed) and the local
    group grow back exactly when the generation committed a checkpoint."""
    from tests.unit.builders import at, job, pod, running

    from torchjob.launch.policy import GroupScalingPolicy
    from torchjob.rules import Resize
    from torchjob_operator.torchjob.observed import ProbeView
    from torchjob_operator.torchjob.plan import plan

    builder = job().replicas(2).elastic(1, 2)
    builder.spec["checkpoint"] = {"path": "s3://bucket/run"}
    builder.spec["elastic"]["scaleUpCooldownSeconds"] = 30
    progress = {"lastCheckpoint": "s3://bucket/run/checkpoint_000003"}
    progress["checkpointGeneration"] = 1 if checkpoint else 0  # type: ignore[assignment]
    view = builder.with_status(
        phase="Running",
        currentGeneration=1,
        createdGeneration=1,
        replicas=1,
        specReplicas=2,
        startTime="2026-01-01T00:00:00Z",
        lastRescaleTime="2026-01-01T00:00:10Z",
        progress=progress,
    ).build()
    placed = [ProbeView("tj-probe-0", scheduled=True)]
    decided = plan(view, [running(pod(0, 1))], at(100), probes=placed)
    operator_grew = "ScaledUp" in {e.reason for e in decided.events}

    rules = ElasticRules(floor=1, ceiling=2, grow_cooldown_s=30)
    state = RunState(num_workers=1, generation=1, checkpoints_in_generation=int(checkpoint))
    local = GroupScalingPolicy(rules).decide_for(state, now_s=90.0, available_workers=2)
    assert operator_grew is isinstance(local, Resize) is checkpoint
