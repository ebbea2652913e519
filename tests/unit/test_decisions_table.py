"""One table of scenarios, two launchers: ``torchjob run`` (local processes) and the
operator's planner (pods) must reach the same verdict, because both ask ``torchjob.plan``.

Each scenario is written once, as what happened to the workers of a running generation;
it is then played through ``torchjob.client.local.decide`` (members are local processes,
a preemption is a process killed by SIGTERM) and through ``torchjob_operator.torchjob.plan``
(members are pods, a preemption is a DisruptionTarget condition).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import T0, at, failed, job, pod, preempted, running, succeeded

from torchjob.api.models import TorchJobSpec
from torchjob.client.local import decide, process_member
from torchjob.launch.policy import RunState, next_generation
from torchjob.plan import Counters
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import plan

POLICY = {"backoff": {"initialSeconds": 10, "factor": 2.0, "maxSeconds": 300}}


@dataclass(frozen=True)
class Scenario:
    workers: tuple[str, ...]
    """Per worker: "run", "ok", "exit:<code>", "preempted"."""
    restarts: int = 0
    spec: tuple[tuple[str, Any], ...] = ()
    now_s: float = 60.0
    started_s: float = 0.0


@dataclass(frozen=True)
class Verdict:
    action: str
    reason: str
    counters: Counters
    backoff_s: float = 0.0


SCENARIOS = {
    "failure": (
        Scenario(("run", "exit:1")),
        Verdict("restart", "WorkerFailed", Counters(1, 1, 0), 10.0),
    ),
    "second-failure-backs-off-longer": (
        Scenario(("exit:1", "run"), restarts=1),
        Verdict("restart", "WorkerFailed", Counters(1, 2, 0), 20.0),
    ),
    "permanent-code": (
        Scenario(("run", "exit:42"), spec=(("permanentExitCodes", [42]),)),
        Verdict("fail", "PermanentFailure", Counters(0, 0, 0)),
    ),
    "outside-retryable": (
        Scenario(("run", "exit:3"), spec=(("retryableExitCodes", [1, 2]),)),
        Verdict("fail", "PermanentFailure", Counters(0, 0, 0)),
    ),
    "budget-spent": (
        Scenario(("exit:1", "run"), restarts=3),
        Verdict("fail", "RestartLimitExceeded", Counters(0, 3, 0)),
    ),
    "preemption": (
        Scenario(("run", "preempted")),
        Verdict("restart", "WorkerDisrupted", Counters(1, 0, 1)),
    ),
    "preemption-beats-a-peer-failure": (
        Scenario(("exit:1", "preempted")),
        Verdict("restart", "WorkerDisrupted", Counters(1, 0, 1)),
    ),
    "success": (
        Scenario(("ok", "ok")),
        Verdict("succeed", "AllWorkersSucceeded", Counters(0, 0, 0)),
    ),
    "still-running": (
        Scenario(("ok", "run")),
        Verdict("continue", "", Counters(0, 0, 0)),
    ),
    "deadline": (
        Scenario(("run", "run"), now_s=100.0, spec=(("activeDeadlineSeconds", 30),)),
        Verdict("fail", "DeadlineExceeded", Counters(0, 0, 0)),
    ),
}


def _spec_dict(s: Scenario) -> dict[str, Any]:
    policy: dict[str, Any] = {"maxRestarts": 3, **POLICY}
    run_policy: dict[str, Any] = {}
    for key, value in s.spec:
        if key == "activeDeadlineSeconds":
            run_policy[key] = value
        else:
            policy[key] = value
    spec: dict[str, Any] = {
        "replicas": len(s.workers),
        "failurePolicy": policy,
        "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
    }
    if run_policy:
        spec["runPolicy"] = run_policy
    return spec


def through_local(s: Scenario) -> Verdict:
    codes = {"run": None, "ok": 0, "preempted": -signal.SIGTERM}
    members = [
        process_member("tj", i, codes[w] if w in codes else int(w.split(":")[1]), at(5))
        for i, w in enumerate(s.workers)
    ]
    d = decide(
        TorchJobSpec.model_validate(_spec_dict(s)),
        Counters(restarts=s.restarts),
        members,
        start_time=at(s.started_s),
        now=at(s.now_s),
    )
    return Verdict(d.action, d.reason, d.counters, d.backoff_s)


def _pod(i: int, w: str) -> PodView:
    p = running(pod(i))
    if w == "ok":
        return succeeded(p)
    if w == "preempted":
        return preempted(p)
    if w.startswith("exit:"):
        return failed(p, int(w.split(":")[1]), at_s=5)
    return p


def through_operator(s: Scenario) -> Verdict:
    b = job().with_status(
        phase="Running",
        currentGeneration=0,
        createdGeneration=0,
        replicas=len(s.workers),
        specReplicas=len(s.workers),
        restarts=s.restarts,
        disruptions=0,
        startTime="2026-01-01T00:00:00Z",
    )
    b.spec = _spec_dict(s)
    now = at(s.now_s)
    decided = plan(b.build(), [_pod(i, w) for i, w in enumerate(s.workers)], now)
    st = decided.status
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    action = {
        "Restarting": "restart",
        "Failed": "fail",
        "Succeeded": "succeed",
    }.get(st["phase"], "continue")
    backoff = 0.0
    if st.get("restartAfter"):
        after = datetime.fromisoformat(st["restartAfter"].replace("Z", "+00:00"))
        backoff = (after - now).total_seconds()
    return Verdict(
        action,
        ready["reason"] if action != "continue" else "",
        Counters(st["currentGeneration"], st["restarts"], st["disruptions"]),
        backoff,
    )


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_local_launcher_and_operator_reach_the_same_verdict(name: str) -> None:
    scenario, expected = SCENARIOS[name]
    local, operator = through_local(scenario), through_operator(scenario)
    assert local == expected, f"torchjob run: {local}"
    assert operator == expected, f"operator: {operator}"


def test_rescale_starts_a_generation_charged_to_no_counter() -> None:
    # The operator: kubectl scale 2 -> 3.
    b = (
        job()
        .replicas(3)
        .with_status(
            phase="Running",
            currentGeneration=0,
            createdGeneration=0,
            replicas=2,
            specReplicas=2,
            restarts=1,
            disruptions=1,
        )
    )
    st = plan(b.build(), [running(pod(0)), running(pod(1))], T0 + timedelta(seconds=1)).status
    operator = Counters(st["currentGeneration"], st["restarts"], st["disruptions"])
    # TorchTrainer: an elastic group grows back from 2 to 3 workers.
    s = next_generation(
        RunState(num_workers=2, failures=1, disruptions=1), 3, charged=False, now_s=1.0
    )
    local = Counters(s.generation, s.failures, s.disruptions)
    assert operator == local == Counters(0, 1, 1).resized() == Counters(1, 1, 1)
