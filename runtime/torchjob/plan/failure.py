"""The failure verdict: restart the group, or fail (permanent exit code, budget spent).

The restart counter is passed in (never kept in a policy object), so deciding twice
gives the same answer: the operator replays a decision after a crash and gets the
same one. The policy is plain values (``RestartRules``): the operator builds them from
the TorchJob's ``spec.failurePolicy`` (``RestartRules.of``), local launchers from their
own budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from torchjob.api.models import FailurePolicy


@dataclass(frozen=True)
class RestartRules:
    """What a failure costs, as plain values: the restart budget, the backoff between
    restarts, and the exit-code classes (``spec.failurePolicy`` without the CRD model)."""

    max_restarts: int | None
    """Failure restarts allowed; ``None`` is unlimited (a local budget such as Ray's
    ``max_failures=-1``)."""
    backoff_initial_s: float = 0.0
    """Delay before the first restart."""
    backoff_factor: float = 2.0
    backoff_max_s: float = 0.0
    """Cap on the delay."""
    permanent_exit_codes: frozenset[int] = frozenset()
    """Exit codes that fail at once, without a restart."""
    retryable_exit_codes: frozenset[int] = frozenset()
    """When not empty, only these exit codes restart; any other code is permanent."""

    @classmethod
    def of(cls, policy: FailurePolicy) -> RestartRules:
        """The rules of a TorchJob's ``spec.failurePolicy``."""
        b = policy.backoff
        return cls(
            max_restarts=policy.max_restarts,
            backoff_initial_s=b.initial_seconds,
            backoff_factor=b.factor,
            backoff_max_s=b.max_seconds,
            permanent_exit_codes=frozenset(policy.permanent_exit_codes or ()),
            retryable_exit_codes=frozenset(policy.retryable_exit_codes or ()),
        )


class Verdict(str, Enum):
    RESTART_GROUP = "RestartGroup"
    """A failure: the next generation after the backoff, one restart charged."""
    FAIL_PERMANENT = "PermanentFailure"
    FAIL_BUDGET_EXHAUSTED = "RestartLimitExceeded"
    DISRUPTED = "Disrupted"
    """Taken away, not failed: the next generation at once, charged to no budget
    (``torchjob.plan.restart.decide_restart`` only; ``decide_failure`` never says it)."""


@dataclass(frozen=True)
class FailureDecision:
    verdict: Verdict
    backoff_s: float = 0.0
    restarts_after: int = 0
    """The restart counter once this decision is carried out."""
    explanation: str = ""


def is_permanent(exit_code: int | None, policy: FailurePolicy) -> bool:
    """Exit-code classes: listed permanent codes, or anything outside an explicit retryable list."""
    return _is_permanent(exit_code, RestartRules.of(policy))


def _is_permanent(exit_code: int | None, rules: RestartRules) -> bool:
    if exit_code is None:
        return False
    if exit_code in rules.permanent_exit_codes:
        return True
    return bool(rules.retryable_exit_codes) and exit_code not in rules.retryable_exit_codes


_MAX_EXPONENT = 1024
"""The exponent is capped, so a huge restart number costs nothing and 1.0 ** n stays exact;
a float power past the float range raises OverflowError, which means "the cap"."""


def backoff_seconds(restart_number: int, policy: FailurePolicy) -> float:
    """Delay before restart number ``restart_number`` (1-based): initial * factor^(n-1), capped
    at ``maxSeconds``. Never overflows: the exponent is capped, and so is the result."""
    return _backoff_seconds(restart_number, RestartRules.of(policy))


def _backoff_seconds(restart_number: int, rules: RestartRules) -> float:
    if restart_number <= 0:
        return 0.0
    exponent = min(restart_number - 1, _MAX_EXPONENT)
    try:
        delay = rules.backoff_initial_s * (rules.backoff_factor**exponent)
    except OverflowError:
        delay = math.inf
    return float(min(delay, rules.backoff_max_s))


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
    return _decide_failure(exit_code, restarts, RestartRules.of(policy), permanent)


def _decide_failure(
    exit_code: int | None, restarts: int, rules: RestartRules, permanent: bool | None
) -> FailureDecision:
    if permanent if permanent is not None else _is_permanent(exit_code, rules):
        what = f"exit code {exit_code}" if exit_code is not None else "this failure"
        return FailureDecision(
            Verdict.FAIL_PERMANENT,
            restarts_after=restarts,
            explanation=f"{what} is permanent under spec.failurePolicy",
        )
    limit = rules.max_restarts
    if limit is not None and restarts >= limit:
        return FailureDecision(
            Verdict.FAIL_BUDGET_EXHAUSTED,
            restarts_after=restarts,
            explanation=f"restart budget exhausted ({restarts}/{limit} restarts used)",
        )
    n = restarts + 1
    return FailureDecision(
        Verdict.RESTART_GROUP,
        backoff_s=_backoff_seconds(n, rules),
        restarts_after=n,
        explanation=f"restart {n}/{'unlimited' if limit is None else limit}",
    )
