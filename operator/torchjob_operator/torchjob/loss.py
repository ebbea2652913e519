"""After a loss: what a disrupted or failed generation becomes.

``torchjob.rules.decide_restart`` decides the counters, the verdict and the size (the same
function every local launcher calls, over the judged ``Loss``, the job's
``spec.failurePolicy`` as plain ``RestartRules`` and its ``spec.elastic`` as ``ElasticRules``);
this module puts them into Kubernetes terms: which pods form the next generation (ready
standbys taking the lost places, the survivors going on at once, or the whole group
replaced), when it starts (a charged restart waits its backoff; a loss that is not the job's,
or a hard loss whose survivors hold the state, never does), and what the status says.
Pure: takes a ``Decision`` and returns a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from torchjob import contract
from torchjob.api.models import FailureRecord, MembershipPolicy, Phase
from torchjob.rules import Judgement, Outcome, RestartRules
from torchjob.rules.restart import RestartDecision, decide_restart
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.clock import format_time
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.elastic import (
    elastic_rules,
    in_rank_order,
    replace_with_standbys,
    survivors_first,
    target_replicas,
)
from torchjob_operator.torchjob.ending import end, finish
from torchjob_operator.torchjob.observed import PodView


def survives(p: PodView) -> bool:
    """A pod worth keeping into a new generation: placed, alive, and not being taken away."""
    return p.active and p.scheduled and p.disruption is None


def survivors_hold_state(d: Decision, survivors: Sequence[PodView]) -> bool:
    """KeepSurvivors with survivors: they keep their processes and the last completed step in
    memory (``torchjob.train.recovery.restore_point``)."""
    return bool(survivors) and d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS


def after_loss(
    d: Decision, verdict: Judgement, current: Sequence[PodView], pods: Sequence[PodView]
) -> tuple[Decision, bool]:
    """A DISRUPTED or FAILED generation: (the decision, whether the job ended for good).
    Any other outcome: ``d`` unchanged."""
    if verdict.outcome not in (Outcome.DISRUPTED, Outcome.FAILED) or verdict.loss is None:
        return d, False
    survivors = [p for p in current if survives(p)]
    standbys = replace_with_standbys(d, survivors, pods)
    kept = in_rank_order(d, survivors)
    decision = decide_restart(
        d.counters(),
        RestartRules.of(d.job.spec.failure_policy),
        verdict.loss,
        workers=d.replicas,
        survivors=len(kept),
        # Standbys (or a leaver's replacements) taking the places keep the size: no shrink
        # to explain ("shrinking to 5 workers" was said of a swap at 8).
        elastic=elastic_rules(d) if standbys is None else None,
        survivors_hold_state=survivors_hold_state(d, survivors),
    )
    if verdict.outcome == Outcome.FAILED:
        d = _record_failure(d, verdict)
        text = cond.message("WorkerFailed", detail=verdict.detail, explanation=decision.explanation)
        if not decision.restarts:
            return finish(end(d, Phase.FAILED, decision.verdict.value, text), pods), True
    if standbys is not None:
        # Charged or not as decided, but no pod is started: no backoff to wait for.
        d = d.count(decision.counters, len(standbys), standbys)
        return took_over(d, standbys, survivors, verdict.detail, decision.explanation), False
    if decision.shrunk:
        return _shrunk(d, decision, kept, verdict.detail), False
    replicas = d.job.spec.replicas
    if decision.charged:
        d = d.count(decision.counters, replicas)
        d = d.but(restart_after=d.now + timedelta(seconds=decision.backoff_s))
        return d.transition(Phase.RESTARTING, "WorkerFailed", text, warning=True), False
    # Not the job's doing: replaced at full size at once, the survivors first (KeepSurvivors).
    d = d.count(decision.counters, replicas, survivors_first(d, survivors, replicas, pods))
    d = d.but(restart_after=None)
    return d.transition(
        Phase.RESTARTING,
        "WorkerDisrupted",
        cond.message("WorkerDisrupted", detail=verdict.detail, disruptions=d.disruptions),
        warning=True,
    ), False


def _record_failure(d: Decision, verdict: Judgement) -> Decision:
    culprit = verdict.culprit
    assert isinstance(culprit, PodView)
    return d.but(
        last_failure=FailureRecord(
            pod=culprit.name,
            exit_code=culprit.exit_code,
            reason=culprit.reason or "Error",
            message=(culprit.summary or culprit.message)[:1024],
            time=format_time(culprit.finished_at or d.now),
        )
    )


def _shrunk(d: Decision, decision: RestartDecision, kept: tuple[int, ...], detail: str) -> Decision:
    """The next generation with the survivors only, published at once (nothing to create, no
    backoff: the lost pod may still be checkpointing for its grace period); the replacement
    joins the generation after this one (``elastic.grow_with_joiners``)."""
    el = d.job.spec.elastic
    assert el is not None
    d = d.count(decision.counters, len(kept), kept)
    d = d.but(created_generation=d.generation, restart_after=None)
    if decision.charged:  # a hard loss (the OOM killer): charged, from the survivors' memory
        said = cond.say(
            "ShrunkAfterLoss",
            detail=detail,
            explanation=decision.explanation,
            replicas=len(kept),
            target=target_replicas(d),
            min=el.min_replicas,
        )
    else:
        said = cond.say(
            "ShrunkAfterDisruption",
            detail=detail,
            disruptions=d.disruptions,
            replicas=len(kept),
            target=target_replicas(d),
            min=el.min_replicas,
        )
    return d.transition(Phase.RESTARTING, *said, warning=True)


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
