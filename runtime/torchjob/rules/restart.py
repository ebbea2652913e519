"""What happens after a generation is judged lost: the one decision every launcher calls.

A generation ends in a :data:`torchjob.rules.loss.Loss`: a failure (the job's own: a non-zero
exit, an exception, a hang, an OOM kill) or a loss that is not the job's (a disruption, a
silent peer, a worker stopped as asked). ``decide_restart`` turns it into the next step, with
the counters already moved (``torchjob.rules.generation``):

* a loss that is not the job's starts the next generation at once and charges no budget;
  where the ``ElasticRules`` shrink on a loss and enough survivors are left (``floor``), the
  next generation goes on with the survivors, else the lost workers are replaced;
* a failure fails at once when its exit code is permanent, fails when the restart budget
  is spent, and otherwise restarts the group after the backoff, one restart charged
  (``torchjob.rules.failure``);
* where the survivors hold the last completed step's state in memory (``survivors_hold_state``:
  their processes outlive the loss and re-form in place, ``torchjob.train.recovery.restore_point``),
  the next generation restores from that memory, not from storage (:class:`Recovery`). A
  worker killed with no grace (``Failure.hard``: the OOM killer) is still charged, but the
  group starts at once, with no backoff, and an elastic group goes on with its survivors: the
  backoff guards against a crash loop of starting processes, and here the survivors are
  running and hold the state. A failure of the survivors' own code (an exception) keeps its
  backoff and its size.

The operator's planner, ``torchjob run``, TorchTrainer's controller and
``PyTorchTrainer.train`` call it with plain ``RestartRules`` and ``ElasticRules``; what each
does around it (conditions, events, messages, which pods go) is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from torchjob.rules.failure import RestartRules, Verdict, decide_failure
from torchjob.rules.generation import Counters
from torchjob.rules.loss import ElasticRules, Failure, Loss


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
    """The size of the next generation (the current size unless a loss shrank it)."""
    backoff_s: float = 0.0
    """Wait this long before the next generation's workers start (charged restarts only)."""
    explanation: str = ""
    recovery: Recovery = Recovery.STORAGE
    """Where the next generation restores from (meaningless when the job ends)."""
    shrunk: bool = False
    """The next generation goes on with the survivors only (``workers`` of them)."""

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
    loss: Loss,
    *,
    workers: int,
    survivors: int | None = None,
    elastic: ElasticRules | None = None,
    survivors_hold_state: bool = False,
) -> RestartDecision:
    """The next step after a generation of ``workers`` was judged lost to ``loss``.

    ``survivors``: how many workers outlive the loss (default ``workers - 1``): the size of
    the next generation where ``elastic`` shrinks on a loss (``ElasticRules.shrinks_to``).
    Without ``elastic`` (or with no room to shrink) the next generation keeps ``workers``.
    ``survivors_hold_state``: some workers of the lost generation live on and hold the last
    completed step's state in memory: the recovery is :attr:`Recovery.MEMORY`.
    """
    recovery = Recovery.MEMORY if survivors_hold_state else Recovery.STORAGE
    left = workers - 1 if survivors is None else survivors
    shrink = elastic is not None and elastic.shrinks_to(left)
    size = left if shrink else workers
    if not isinstance(loss, Failure):
        what = f"disruption {counters.disruptions + 1}"
        if shrink:
            what += f": shrinking to {size} workers"
        return RestartDecision(
            Verdict.DISRUPTED,
            counters.disrupted(),
            size,
            shrunk=shrink,
            explanation=f"{what}, the restart budget is not charged",
            recovery=recovery,
        )
    d = decide_failure(
        loss.exit_code, restarts=counters.restarts, rules=rules, permanent=loss.permanent
    )
    if d.verdict is not Verdict.RESTART_GROUP:
        return RestartDecision(
            d.verdict, counters, workers, explanation=d.explanation, recovery=recovery
        )
    after = counters.restarted()
    assert after.restarts == d.restarts_after, (after, d)
    in_place = survivors_hold_state and loss.hard
    backoff = 0.0 if in_place else d.backoff_s
    shrink = shrink and in_place
    explanation = d.explanation
    if survivors_hold_state:
        explanation += ", in place from the survivors' memory"
        if in_place and d.backoff_s:
            explanation += " (no backoff: the survivors hold the state)"
    return RestartDecision(
        d.verdict,
        after,
        size if shrink else workers,
        backoff,
        shrunk=shrink,
        explanation=explanation,
        recovery=recovery,
    )
