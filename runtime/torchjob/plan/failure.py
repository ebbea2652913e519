"""The failure verdict: restart the group, or fail (permanent exit code, budget spent).

The restart counter is passed in (never kept in a policy object), so deciding twice
gives the same answer: the operator replays a decision after a crash and gets the
same one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from torchjob.api.models import FailurePolicy


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


_MAX_EXPONENT = 1024
"""The exponent is capped, so a huge restart number costs nothing and 1.0 ** n stays exact;
a float power past the float range raises OverflowError, which means "the cap"."""


def backoff_seconds(restart_number: int, policy: FailurePolicy) -> float:
    """Delay before restart number ``restart_number`` (1-based): initial * factor^(n-1), capped
    at ``maxSeconds``. Never overflows: the exponent is capped, and so is the result."""
    b = policy.backoff
    if restart_number <= 0:
        return 0.0
    exponent = min(restart_number - 1, _MAX_EXPONENT)
    try:
        delay = b.initial_seconds * (b.factor**exponent)
    except OverflowError:
        delay = math.inf
    return float(min(delay, b.max_seconds))


def decide_failure(
    exit_code: int | None,
    *,
    restarts: int,
    policy: FailurePolicy,
    permanent: bool | None = None,
) -> FailureDecision:
    """What to do after a failure, given the restarts already spent.

    ``permanent`` overrides the exit-code classes for launchers that know the class from
    elsewhere (``PyTorchTrainer.train``: a user's exception is never retried).
    """
    if permanent if permanent is not None else is_permanent(exit_code, policy):
        what = f"exit code {exit_code}" if exit_code is not None else "this failure"
        return FailureDecision(
            Verdict.FAIL_PERMANENT,
            restarts_after=restarts,
            explanation=f"{what} is permanent under spec.failurePolicy",
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
