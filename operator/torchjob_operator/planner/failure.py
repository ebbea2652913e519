"""The failure policy: what the loss of a worker means for the job.

``judge_generation`` looks at *all* pods of the current generation before it
decides, because a peer's crash (NCCL/gloo error when a neighbour vanished) is
often seen before the preempted pod's DisruptionTarget condition. Any
disruption in the generation makes the whole event a disruption, which never
consumes ``maxRestarts``.

Among failed pods, one whose runtime said it failed only because a peer did
(``PodView.peer_failure``, from the termination message) is never blamed while
another failed pod explains it; and while *every* failed pod blames a peer and
others still run, the judgement waits up to ``ROOT_CAUSE_GRACE`` for the pod
that raised to exit too. Pod timestamps have one-second resolution, so this,
not the clock, is what finds the root cause.

``decide_failure`` turns a failure into a verdict, with the restart counter
passed in (never kept in a policy object), so deciding twice gives the same
answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from torchjob.api.models import FailurePolicy
from torchjob_operator.planner.observed import PodPhase, PodView


class Outcome(str, Enum):
    HEALTHY = "Healthy"
    """Nothing lost: keep going."""
    SUCCEEDED = "Succeeded"
    """Every worker of the generation exited 0."""
    DISRUPTED = "Disrupted"
    """The cluster took a worker away (preemption, eviction, node loss, deletion by someone else)."""
    FAILED = "Failed"
    """A worker exited non-zero on its own."""
    AWAITING_ROOT_CAUSE = "AwaitingRootCause"
    """Failed pods only blame a peer that still runs: wait briefly for its own failure."""


ROOT_CAUSE_GRACE = timedelta(seconds=10)
"""How long failed pods that blame a peer wait for that peer's own exit before one is blamed."""


@dataclass(frozen=True)
class Judgement:
    outcome: Outcome
    culprit: PodView | None = None
    """The pod the outcome is blamed on: the disrupted pod, or the first one that failed."""
    detail: str = ""
    recheck_after_s: float | None = None
    """For AWAITING_ROOT_CAUSE: judge again after this many seconds at the latest."""


def _first_failed(pods: list[PodView]) -> PodView:
    """Root cause: the earliest non-zero exit; ties and unknown times by index."""
    far = datetime.max.replace(tzinfo=None)
    return min(
        pods,
        key=lambda p: (
            p.finished_at.replace(tzinfo=None) if p.finished_at else far,
            p.index,
        ),
    )


def judge_generation(
    pods: list[PodView], *, replicas: int, missing: list[int], now: datetime | None = None
) -> Judgement:
    """Classify the state of the current generation's pods.

    ``pods`` are the pods of the current generation; ``missing`` the indices
    that were created and have since vanished. Without ``now`` a failure is
    judged at once (no waiting for a root cause).
    """
    disrupted = [p for p in pods if p.disruption is not None or p.deleting]
    if disrupted:
        # A pod with a known reason explains the event better than one that merely vanished.
        culprit = min(disrupted, key=lambda p: (p.disruption is None, p.index))
        why = culprit.disruption or "deleted by another client"
        return Judgement(Outcome.DISRUPTED, culprit, f"{culprit.name}: {why}")
    if missing:
        return Judgement(Outcome.DISRUPTED, None, f"worker {missing[0]} was deleted")
    failed = [p for p in pods if p.phase == PodPhase.FAILED]
    if failed:
        own = [p for p in failed if not p.peer_failure]
        if not own and now is not None:
            wait = _root_cause_wait(failed, pods, now)
            if wait is not None:
                return Judgement(
                    Outcome.AWAITING_ROOT_CAUSE,
                    detail=f"{len(failed)} worker(s) failed because of a peer",
                    recheck_after_s=wait,
                )
        culprit = _first_failed(own or failed)
        code = "unknown" if culprit.exit_code is None else str(culprit.exit_code)
        why = culprit.reason or "Error"
        detail = f"{culprit.name} exited with code {code} ({why})"
        if culprit.summary:
            detail += f": {culprit.summary[:300]}"
        return Judgement(Outcome.FAILED, culprit, detail)
    if len(pods) == replicas and all(p.phase == PodPhase.SUCCEEDED for p in pods):
        return Judgement(Outcome.SUCCEEDED)
    return Judgement(Outcome.HEALTHY)


def _root_cause_wait(failed: list[PodView], pods: list[PodView], now: datetime) -> float | None:
    """Seconds left to wait for a still-running peer to report its own failure, or None."""
    if not any(p.active for p in pods):
        return None
    times = [p.finished_at for p in failed if p.finished_at is not None]
    if not times:
        return None
    left = (min(times) + ROOT_CAUSE_GRACE - now).total_seconds()
    return left if left > 0 else None


class Verdict(str, Enum):
    RESTART_GROUP = "RestartGroup"
    FAIL_PERMANENT = "PermanentFailure"
    FAIL_BUDGET_EXHAUSTED = "RestartLimitExceeded"


@dataclass(frozen=True)
class FailureDecision:
    verdict: Verdict
    backoff_s: float = 0.0
    restarts_after: int = 0
    """The restart counter once this decision is carried out."""
    explanation: str = ""


def is_permanent(exit_code: int | None, policy: FailurePolicy) -> bool:
    """Exit-code classes: listed permanent codes, or anything outside an explicit retryable list."""
    if exit_code is None:
        return False
    if policy.permanent_exit_codes and exit_code in policy.permanent_exit_codes:
        return True
    return bool(policy.retryable_exit_codes) and exit_code not in (
        policy.retryable_exit_codes or ()
    )


def backoff_seconds(restart_number: int, policy: FailurePolicy) -> float:
    """Delay before restart number ``restart_number`` (1-based): initial * factor^(n-1), capped."""
    b = policy.backoff
    if restart_number <= 0:
        return 0.0
    delay = b.initial_seconds * (b.factor ** (restart_number - 1))
    return float(min(delay, b.max_seconds))


def decide_failure(
    exit_code: int | None, *, restarts: int, policy: FailurePolicy
) -> FailureDecision:
    """What to do after a failure, given the restarts already spent."""
    if is_permanent(exit_code, policy):
        return FailureDecision(
            Verdict.FAIL_PERMANENT,
            restarts_after=restarts,
            explanation=f"exit code {exit_code} is permanent under spec.failurePolicy",
        )
    if restarts >= policy.max_restarts:
        return FailureDecision(
            Verdict.FAIL_BUDGET_EXHAUSTED,
            restarts_after=restarts,
            explanation=f"restart budget exhausted ({restarts}/{policy.max_restarts} restarts used)",
        )
    n = restarts + 1
    return FailureDecision(
        Verdict.RESTART_GROUP,
        backoff_s=backoff_seconds(n, policy),
        restarts_after=n,
        explanation=f"restart {n}/{policy.max_restarts}",
    )
