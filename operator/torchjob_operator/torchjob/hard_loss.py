"""A hard loss: a worker pod's trainer killed with no grace (SIGKILL, the OOM killer, a node
that vanished), under ``membershipPolicy: KeepSurvivors``.

The survivors keep their processes and hold the last completed step's state in memory
(``torchjob.train.restore_point``), so what a hard loss costs is decided here:

* it is charged as the failure policy says (it may be an OOM), but with no backoff
  (``torchjob.rules.decide_restart(killed=True)``): the backoff guards against a crash loop
  of starting processes, and here the survivors run and hold the state;
* an elastic job that asks to go on smaller on a disruption (``elastic.shrinkOnDisruption``,
  ``minReplicas`` survivors left) goes on smaller on a hard loss too, at once
  (:func:`shrink_after_kill`): the survivors re-form in place from their memory, and the
  replacement is created as a joiner of the generation after and joins when it is Ready,
  as after a graceful eviction (``elastic.grow_with_joiners``). Without it the lost pod is
  replaced at full size, without backoff.

Pure: takes a ``Decision`` and returns a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.api.models import MembershipPolicy, Phase
from torchjob.rules.restart import RestartDecision
from torchjob_operator.common import conditions as cond
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.elastic import shrink_at_once, target_replicas
from torchjob_operator.torchjob.observed import PodView

KILLED_EXIT_CODE = 137
"""A container's exit code when its process was SIGKILLed (128 + 9)."""


def killed(p: PodView) -> bool:
    """The pod's trainer was killed from outside: its container exited 137 (every process
    SIGKILLed), the kubelet says OOMKilled, or the runtime said a worker process of the pod
    was SIGKILLed (``contract.TerminationSummary.killed``: the driver outlived it, and its
    own exit is 1)."""
    return p.exit_code == KILLED_EXIT_CODE or p.reason == "OOMKilled" or p.killed


def survivors_hold_state(d: Decision, survivors: Sequence[PodView]) -> bool:
    """KeepSurvivors with survivors: they keep their processes and the last step in memory."""
    return bool(survivors) and d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS


def shrink_after_kill(
    d: Decision,
    culprit: PodView,
    survivors: Sequence[PodView],
    decision: RestartDecision,
    detail: str,
) -> Decision | None:
    """After a charged restart (``decision``) of a hard loss: the next generation with the
    survivors only, published at once (nothing to create, no backoff), or None when the job
    does not go on smaller (not killed, not elastic KeepSurvivors with
    ``shrinkOnDisruption``, or fewer than ``minReplicas`` survivors)."""
    el = d.job.spec.elastic
    if el is None or not killed(culprit) or not decision.charged:
        return None
    smaller = shrink_at_once(d, survivors)
    if smaller is None:
        return None
    d = d.count(decision.counters, len(smaller), smaller)
    return d.but(created_generation=d.generation, restart_after=None).transition(
        Phase.RESTARTING,
        *cond.say(
            "ShrunkAfterLoss",
            detail=detail,
            explanation=decision.explanation,
            replicas=len(smaller),
            target=target_replicas(d),
            min=el.min_replicas,
        ),
        warning=True,
    )
