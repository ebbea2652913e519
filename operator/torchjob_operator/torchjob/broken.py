"""A group that every member left with its own workers alive: the next generation re-forms it.

A KeepSurvivors member whose group broke for a peer (a connection closed, a collective
failed) while none of its own workers died waits for the next generation, and says so in
the job's status: an entry of ``status.silentWorkers`` about itself, ``how: broken``
(``SilentWorker.broken_group``, written by ``torchjob.train.recovery.reports``). Usually
a loss broke it, and the loss publishes the next generation (a pod failed, a node went, the
survivors report a silent peer). When every member of the current generation says its group
broke and the planner sees no loss at all, nothing else ever would: the members waited for
a generation that never came (bench/results/2026-12-03a: generation 19 broke at all 8 ranks
within 43 ms, "Connection closed by peer", every pod alive, and nothing trained for the last
231 s of the row).

A silent report that still waits to count (one that names rank 0's pod waits
``silent.RANK0_HOLD_S``: a partition breaks every member's group too) defers it: the loss
it names decides, and the planner publishes that instead.

Then the next generation is published with the same members in the same rank order, all of
them kept (relabelled, none created): the pods re-form the group under the new generation's
keys in rank 0's store (``torchjob.launch.layout``), resuming from their restore point.

It is charged to no counter, unless the generation it ends was itself published for a broken
group and broke again before it trained a step (its ``status.history`` record never
recovered): a group that breaks every time it forms would loop for ever; charged, it ends
within ``maxRestarts`` as a failure would. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from torchjob import contract
from torchjob.api.models import Phase
from torchjob.rules import RestartRules, Verdict, decide_failure
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.ending import end
from torchjob_operator.torchjob.observed import JobState, PodView

CAUSE = "GroupBroken"
"""The reason of the transition, and the ``status.history`` cause of the generation."""


def broken_by(state: JobState, generation: int) -> frozenset[str]:
    """The pods that said their group of ``generation`` broke with their workers alive."""
    return frozenset(r.pod for r in state.broken if r.generation == generation)


def _again(state: JobState, generation: int) -> bool:
    """``generation`` was published for a broken group and has not trained since."""
    record = next((h for h in reversed(state.history) if h.generation == generation), None)
    return record is not None and record.cause == CAUSE and record.recovery_seconds is None


def reform_broken(d: Decision, current: Sequence[PodView]) -> Decision | None:
    """The next generation, same members, when every member of the current one (each
    present, none being deleted) said its group broke; else None. Called only once the
    planner found no loss in the generation. A group that broke again before a step is
    charged as a failure restart (after its backoff), and the job fails once the budget is
    spent (``end``: the caller finishes it)."""
    st = d.job.state
    names = {contract.worker_pod_name(d.job.name, i) for i in d.ranked}
    alive = {p.name for p in current if p.active}
    if d.generation != st.generation or not names <= alive:
        return None
    if not names <= broken_by(st, d.generation):
        return None
    said = {"generation": d.generation, "count": len(names)}
    if not _again(st, d.generation):
        d = d.count(d.counters().resized(), d.replicas, d.ranked).but(restart_after=None)
        cost = "the restart budget is not charged"
    else:
        rules = RestartRules.of(d.job.spec.failure_policy)
        decision = decide_failure(None, restarts=d.restarts, rules=rules, permanent=False)
        cost = f"it broke again before a step: {decision.explanation}"
        if decision.verdict != Verdict.RESTART_GROUP:
            return end(d, Phase.FAILED, decision.verdict.value, _said(cost, **said))
        d = d.count(d.counters().restarted(), d.replicas, d.ranked)
        d = d.but(restart_after=d.now + timedelta(seconds=decision.backoff_s))
    detail = _said(cost, **said)
    d = d.but(created_generation=d.generation).transition(
        Phase.RESTARTING, CAUSE, detail, warning=True
    )
    if not any(e.reason == CAUSE for e in d.events):  # the same transition as the last pass's
        d = d.also(events=[Event("Warning", CAUSE, detail)])
    return d


def _said(cost: str, *, generation: int, count: int) -> str:
    return cond.message(CAUSE, generation=generation, count=count, charged=cost)
