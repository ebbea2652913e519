"""What happens after a generation is judged lost: the one decision every launcher calls.

A generation ends in a failure (a worker's own non-zero exit, exception or hang) or a
disruption (the worker was taken away). ``decide_restart`` turns that into the next step,
with the counters already moved (``torchjob.rules.generation``):

* a disruption starts the next generation at once and charges no budget; where a
  disruption shrinks the group (``shrink_floor``: TorchTrainer's elastic local group)
  the next generation has one worker fewer, and a loss that would take the group below
  the floor is charged as a failure instead;
* a failure fails at once when its exit code is permanent, fails when the restart budget
  is spent, and otherwise restarts the group after the backoff, one restart charged
  (``torchjob.rules.failure``);
* where the survivors hold the last completed step's state in memory (``survivors_hold_state``:
  their processes outlive the loss and re-form in place, ``torchjob.train.restore_point``),
  the next generation restores from that memory, not from storage (:class:`Recovery`). A
  process killed from outside (``killed``: SIGKILL, the OOM killer, a vanished node) is still
  charged as the failure policy says, but it starts at once, with no backoff: the backoff
  guards against a crash loop of starting processes, and here the survivors are running and
  hold the state. A failure of the survivors' own code (an exception) keeps its backoff.

The operator's planner, ``torchjob run``, TorchTrainer's controller and
``PyTorchTrainer.train`` call it with plain ``RestartRules``; what each does around it
(conditions, events, messages, which pods go) is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from torchjob.rules.failure import RestartRules, Verdict, decide_failure
from torchjob.rules.generation import Counters


class Recovery(str, Enum):
    """Where the next generation's state comes from."""

    STORAGE = "Storage"
    """The latest committed checkpoint (every replica was lost, or none held the state)."""
    MEMORY = "Memory"
    """The survivors' in-memory restore point: the group re-forms in place, a survivor
    broadcasts the last completed step's state to the replacement (or the shrunk group)."""


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
    recovery: Recovery = Recovery.STORAGE
    """Where the next generation restores from (meaningless when the job ends)."""

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
    survivors_hold_state: bool = False,
    killed: bool = False,
) -> RestartDecision:
    """The next step after a generation of ``workers`` was judged lost.

    ``disrupted``: the loss was a disruption (taken away), else a failure with
    ``exit_code`` (None when unknown: never permanent by code). ``permanent`` overrides
    the exit-code classes (``PyTorchTrainer.train``: an infrastructure failure never is).
    ``shrink_floor``: a disruption shrinks the group by one worker, down to this size; a
    disruption with no room to shrink is then a failure. Without it a disruption keeps
    the size.
    ``survivors_hold_state``: some workers of the lost generation live on and hold the last
    completed step's state in memory: the recovery is :attr:`Recovery.MEMORY`.
    ``killed``: the failed worker was killed from outside (a signal, the OOM killer): charged
    as the policy says, and with survivors holding the state, restarted without backoff.
    """
    recovery = Recovery.MEMORY if survivors_hold_state else Recovery.STORAGE
    if disrupted:
        if shrink_floor is None:
            return RestartDecision(
                Verdict.DISRUPTED,
                counters.disrupted(),
                workers,
                explanation=f"disruption {counters.disruptions + 1}, the restart budget is "
                "not charged",
                recovery=recovery,
            )
        if workers - 1 >= shrink_floor:
            return RestartDecision(
                Verdict.DISRUPTED,
                counters.disrupted(),
                workers - 1,
                explanation=f"disruption {counters.disruptions + 1}: shrinking to "
                f"{workers - 1} workers, the restart budget is not charged",
                recovery=recovery,
            )
    d = decide_failure(exit_code, restarts=counters.restarts, rules=rules, permanent=permanent)
    if d.verdict is not Verdict.RESTART_GROUP:
        return RestartDecision(
            d.verdict, counters, workers, explanation=d.explanation, recovery=recovery
        )
    after = counters.restarted()
    assert after.restarts == d.restarts_after, (after, d)
    in_place = survivors_hold_state and killed
    backoff = 0.0 if in_place else d.backoff_s
    explanation = d.explanation
    if survivors_hold_state:
        explanation += ", in place from the survivors' memory"
        if in_place and d.backoff_s:
            explanation += " (no backoff: the survivors hold the state)"
    return RestartDecision(
        d.verdict, after, workers, backoff, explanation=explanation, recovery=recovery
    )
