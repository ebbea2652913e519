"""After a loss: what a disrupted or failed generation becomes.

``torchjob.rules.decide_restart`` decides the counters and the verdict (the same function
every local launcher calls, with the job's ``spec.failurePolicy`` as plain ``RestartRules``);
this module puts them into Kubernetes terms: which pods form the next generation (ready standbys taking the lost
places, the survivors going on at once, or the whole group replaced), when it starts
(a restart waits its backoff, a disruption never), and what the status says.
Pure: takes a ``Decision`` and returns a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from torchjob import contract
from torchjob.api.models import FailureRecord, Phase
from torchjob.rules import Judgement, Outcome, RestartRules, Verdict
from torchjob.rules.restart import RestartDecision, decide_restart
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.clock import format_time
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.elastic import (
    in_rank_order,
    replace_with_standbys,
    shrink_at_once,
    survivors_first,
    target_replicas,
)
from torchjob_operator.torchjob.ending import end, finish
from torchjob_operator.torchjob.hard_loss import killed, shrink_after_kill, survivors_hold_state
from torchjob_operator.torchjob.observed import PodView


def survives(p: PodView) -> bool:
    """A pod worth keeping into a new generation: placed, alive, and not being taken away."""
    return p.active and p.scheduled and p.disruption is None


def after_loss(
    d: Decision, verdict: Judgement, current: Sequence[PodView], pods: Sequence[PodView]
) -> tuple[Decision, bool]:
    """A DISRUPTED or FAILED generation: (the decision, whether the job ended for good).
    Any other outcome: ``d`` unchanged."""
    if verdict.outcome not in (Outcome.DISRUPTED, Outcome.FAILED):
        return d, False
    survivors = [p for p in current if survives(p)]
    standbys = replace_with_standbys(d, survivors, pods)
    if verdict.outcome == Outcome.DISRUPTED:
        return _disrupted(d, verdict.detail, survivors, standbys), False
    return _failed(d, verdict, current, pods, survivors, standbys)


def _disrupted(
    d: Decision,
    detail: str,
    survivors: Sequence[PodView],
    standbys: tuple[int, ...] | None,
) -> Decision:
    """Taken away by the cluster: a new generation at once, the restart budget not charged."""
    spec = d.job.spec
    decision = _rule(d, disrupted=True)
    disrupted = decision.counters
    if standbys is not None:
        d = d.count(disrupted, len(standbys), standbys)
        return took_over(d, standbys, survivors, detail, decision.explanation)
    smaller = shrink_at_once(d, survivors)
    if smaller is not None:
        d = d.count(disrupted, len(smaller), smaller)
    else:
        d = d.count(disrupted, spec.replicas, survivors_first(d, survivors, spec.replicas))
    d = d.but(restart_after=None)
    if smaller is not None and spec.elastic is not None:
        # Go on with the survivors now (the lost pod may still be checkpointing for its
        # grace period); its replacement joins the generation after this one.
        return d.but(created_generation=d.generation).transition(
            Phase.RESTARTING,
            *cond.say(
                "ShrunkAfterDisruption",
                detail=detail,
                disruptions=d.disruptions,
                replicas=len(smaller),
                target=target_replicas(d),
                min=spec.elastic.min_replicas,
            ),
            warning=True,
        )
    return d.transition(
        Phase.RESTARTING,
        "WorkerDisrupted",
        cond.message("WorkerDisrupted", detail=detail, disruptions=d.disruptions),
        warning=True,
    )


def _failed(
    d: Decision,
    verdict: Judgement,
    current: Sequence[PodView],
    pods: Sequence[PodView],
    survivors: Sequence[PodView],
    standbys: tuple[int, ...] | None,
) -> tuple[Decision, bool]:
    """A worker failed: the job fails for good, or restarts (after its backoff, or at once
    where ready standbys take the lost places)."""
    spec = d.job.spec
    culprit = verdict.culprit
    assert isinstance(culprit, PodView)
    d = d.but(
        last_failure=FailureRecord(
            pod=culprit.name,
            exit_code=culprit.exit_code,
            reason=culprit.reason or "Error",
            message=(culprit.summary or culprit.message)[:1024],
            time=format_time(culprit.finished_at or d.now),
        )
    )
    # KeepSurvivors: the survivors keep their processes and the last completed step in
    # memory (torchjob.train.restore_point): a pod killed from outside (SIGKILL, OOMKilled)
    # is charged as the policy says, but with no backoff, and an elastic job goes on smaller
    # at once (torchjob/hard_loss.py); the group resumes from the survivors' memory.
    decision = _rule(
        d,
        disrupted=False,
        exit_code=culprit.exit_code,
        survivors_hold_state=survivors_hold_state(d, survivors),
        killed=killed(culprit),
    )
    text = cond.message("WorkerFailed", detail=verdict.detail, explanation=decision.explanation)
    if decision.verdict != Verdict.RESTART_GROUP:
        return finish(end(d, Phase.FAILED, decision.verdict.value, text), pods), True
    restarted = decision.counters
    if standbys is not None:
        # Charged as any restart, but no pod is started: no backoff to wait for.
        d = d.count(restarted, len(standbys), standbys)
        return took_over(d, standbys, survivors, verdict.detail, decision.explanation), False
    smaller = shrink_after_kill(d, culprit, survivors, decision, verdict.detail)
    if smaller is not None:
        return smaller, False
    d = d.count(restarted, spec.replicas)
    d = d.but(restart_after=d.now + timedelta(seconds=decision.backoff_s))
    return d.transition(Phase.RESTARTING, "WorkerFailed", text, warning=True), False


def _rule(
    d: Decision,
    *,
    disrupted: bool,
    exit_code: int | None = None,
    survivors_hold_state: bool = False,
    killed: bool = False,
) -> RestartDecision:
    """The job rules' one decision after a loss (``torchjob.rules.decide_restart``)."""
    return decide_restart(
        d.counters(),
        RestartRules.of(d.job.spec.failure_policy),
        disrupted=disrupted,
        workers=d.replicas,
        exit_code=exit_code,
        survivors_hold_state=survivors_hold_state,
        killed=killed,
    )


def took_over(
    d: Decision,
    members: tuple[int, ...],
    survivors: Sequence[PodView],
    detail: str,
    counted: str,
) -> Decision:
    """Ready standbys took the lost pods' places in generation ``d.generation``: every pod
    of it exists (nothing to create, no backoff)."""
    d = d.but(created_generation=d.generation, restart_after=None)
    kept = in_rank_order(d, survivors)
    took = ", ".join(contract.worker_pod_name(d.job.name, i) for i in members if i not in kept)
    # Without standbys, the joiner was started for a member given notice (``drain``).
    reason = "StandbyTookOver" if d.job.spec.standby_replicas else "ReplacedBeforeLeaving"
    return d.transition(
        Phase.RESTARTING,
        *cond.say(
            reason,
            detail=detail,
            counted=counted,
            pods=took,
            generation=d.generation,
            replicas=len(members),
        ),
        warning=True,
    )
