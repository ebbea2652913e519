"""What happens after a generation is judged lost: the one decision every launcher calls.

A generation ends in a failure (a worker's own non-zero exit, exception or hang) or a
disruption (the worker was taken away). ``decide_restart`` turns that into the next step,
with the counters already moved (``torchjob.plan.generation``):

* a disruption starts the next generation at once and charges no budget; where a
  disruption shrinks the group (``shrink_floor``: TorchTrainer's elastic local group)
  the next generation has one worker fewer, and a loss that would take the group below
  the floor is charged as a failure instead;
* a failure fails at once when its exit code is permanent, fails when the restart budget
  is spent, and otherwise restarts the group after the backoff, one restart charged
  (``torchjob.plan.failure``).

The operator's planner, ``torchjob run``, TorchTrainer's controller and
``PyTorchTrainer.train`` call it with plain ``RestartRules``; what each does around it
(conditions, events, messages, which pods go) is its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchjob.plan.failure import RestartRules, Verdict, _decide_failure
from torchjob.plan.generation import Counters


@dataclass(frozen=True)
class RestartDecision:
    verdict: Verdict
    """RESTART_GROUP (a charged failure restart), DISRUPTED (an uncharged next
    generation), FAIL_PERMANENT or FAIL_BUDGET_EXHAUSTED (the job ends)."""
    counters: Counters
    """The counters once it is carried out (unchanged when the job ends)."""
    workers: int
    """The size of the next generation (the current size unless a disruption shrank it)."""
    backoff_s: float = 0.0
    """Wait this long before the next generation's workers start (charged restarts only)."""
    explanation: str = ""

    @property
    def restarts(self) -> bool:
        """A next generation follows (False: the job ends)."""
        return self.verdict in (Verdict.RESTART_GROUP, Verdict.DISRUPTED)

    @property
    def charged(self) -> bool:
        """The next generation is charged to the restart budget."""
        return self.verdict is Verdict.RESTART_GROUP


def decide_restart(
    counters: Counters,
    rules: RestartRules,
    *,
    disrupted: bool,
    workers: int,
    exit_code: int | None = None,
    permanent: bool | None = None,
    shrink_floor: int | None = None,
) -> RestartDecision:
    """The next step after a generation of ``workers`` was judged lost.

    ``disrupted``: the loss was a disruption (taken away), else a failure with
    ``exit_code`` (None when unknown: never permanent by code). ``permanent`` overrides
    the exit-code classes (``PyTorchTrainer.train``: an infrastructure failure never is).
    ``shrink_floor``: a disruption shrinks the group by one worker, down to this size; a
    disruption with no room to shrink is then a failure. Without it a disruption keeps
    the size.
    """
    if disrupted:
        if shrink_floor is None:
            return RestartDecision(
                Verdict.DISRUPTED,
                counters.disrupted(),
                workers,
                explanation=f"disruption {counters.disruptions + 1}, the restart budget is "
                "not charged",
            )
        if workers - 1 >= shrink_floor:
            return RestartDecision(
                Verdict.DISRUPTED,
                counters.disrupted(),
                workers - 1,
                explanation=f"disruption {counters.disruptions + 1}: shrinking to "
                f"{workers - 1} workers, the restart budget is not charged",
            )
    d = _decide_failure(exit_code, counters.restarts, rules, permanent)
    if d.verdict is not Verdict.RESTART_GROUP:
        return RestartDecision(d.verdict, counters, workers, explanation=d.explanation)
    return RestartDecision(
        d.verdict, counters.restarted(d), workers, d.backoff_s, explanation=d.explanation
    )
