"""Replace before leaving (``torchjob.rules.drain``), in Kubernetes terms. Pure.

A member pod given notice (``deletionTimestamp`` set by a graceful delete, the
``DisruptionTarget`` condition the Eviction API writes just before it, or a termination
notice on its node, ``torchjob/nodes.py``) whose container still runs is a *leaver*: while its deadline is more than ``MARGIN_S`` away and no ready joiner can
take its place, the generation is judged as if it were not leaving (it still trains), and
``elastic.grow_with_joiners`` creates its replacement under a free pod index: at once, or,
for a node's notice longer than the job needs to start one (:func:`replacement_lead`), that
long before the node goes (``Decision.replace_later``). Once a
joiner is Ready the leaver is judged disrupted, and ``elastic.replace_with_standbys`` puts the
joiner in its place: one generation, one re-formation, at full size. A leaver whose time runs
out first is judged disrupted as before (``shrinkOnDisruption``, a full-size replacement).

Why not always at once: on a fleet whose nodes are noticed every couple of minutes, a
replacement created at a 120 s notice is paid for two minutes of waiting, is placed before
the notices that come meanwhile (and lands on the next noticed node as often as not), and
imports torch beside the job for nothing when that happens (bench/results/2026-11-30q's
120 s row: 61 replacements started in 21 minutes, 4 of 9 notices took every member). Created
a measured lead before the deadline, it is ready in time and sees most of those notices.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from torchjob.api.models import MembershipPolicy, TorchJobSpec
from torchjob.rules.drain import MARGIN_S, drain_left
from torchjob_operator.common.clock import format_time
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.elastic import in_rank_order, replace_with_standbys
from torchjob_operator.torchjob.joining import outlives
from torchjob_operator.torchjob.loss import survives
from torchjob_operator.torchjob.nodes import NODE_LOST, NODE_NOTICE, held_only
from torchjob_operator.torchjob.observed import PodPhase, PodView

REBALANCE = "torchjob.io/rebalance"
"""``PodView.notice`` (and ``status.leavingWorkers[].reason``) of a member that moves off a
crowded node (``torchjob/spread.py``): an open-ended notice, never its end."""

LEAD_FACTOR = 1.5
"""The measured lead is this many times the slowest start of the job's replacements ..."""
LEAD_SLACK_S = 30.0
"""... plus this: the leaver stops ``MARGIN_S`` before its deadline, and the group re-forms
with the replacement before that (twice, 10-15 s apart, when the notice took every member:
``_donor``)."""

NOTICE_RECHECK_S = 1.0
"""How soon a pod marked for disruption but not yet deleted is looked at again (the
Eviction API deletes it right after; its deletion pokes the job anyway)."""


def drains(d: Decision) -> bool:
    """The job lets a pod given notice train on: elastic, KeepSurvivors, ``replaceBeforeLeaving``,
    its generation created."""
    el = d.job.spec.elastic
    return (
        el is not None
        and el.replace_before_leaving
        and d.job.spec.membership_policy == MembershipPolicy.KEEP_SURVIVORS
        and d.created_generation == d.generation
    )


def _deadline(p: PodView) -> datetime | None:
    """When a pod given notice must have stopped: its deletion's, else its node's notice's."""
    return p.deletion_at if p.deleting else p.notice_until


def _given_notice(p: PodView) -> bool:
    return p.deleting or p.disruption is not None or p.notice_until is not None


def leavers(d: Decision, current: Sequence[PodView]) -> tuple[PodView, ...]:
    """Members given notice (a deletion, a DisruptionTarget, a noticed node: never a lost
    node) that still train and may go on doing so."""
    if not drains(d):
        return ()
    return tuple(
        p
        for p in current
        if p.phase == PodPhase.RUNNING
        and p.scheduled
        and p.disruption != NODE_LOST
        and _given_notice(p)
        and (_open_ended(p) or drain_left(_deadline(p), d.now) > 0)
    )


def _open_ended(p: PodView) -> bool:
    """Marked for disruption (DisruptionTarget) but neither deleted nor noticed: the Eviction
    API deletes it right after, so it is looked at again soon (``NOTICE_RECHECK_S``)."""
    return not p.deleting and p.notice_until is None


def replacement_lead(spec: TorchJobSpec, pods: Sequence[PodView]) -> float | None:
    """Seconds before a noticed node goes at which its members' replacements are created:
    ``elastic.replacementLeadSeconds``, else the job's own measure, ``LEAD_FACTOR`` times the
    slowest creation-to-Ready of its pods that started as joiners (``PodView.start_s``) plus
    ``LEAD_SLACK_S``. None (at once) while none has started: the first notice teaches it."""
    el = spec.elastic
    if el is not None and el.replacement_lead_seconds is not None:
        return float(el.replacement_lead_seconds)
    starts = [p.start_s for p in pods if p.joiner and p.start_s is not None]
    if not starts:
        return None
    return LEAD_FACTOR * max(starts) + LEAD_SLACK_S


def replace_at(p: PodView, lead: float | None) -> datetime | None:
    """When leaver ``p``'s replacement is due, if not at once: only a node's notice (not a
    deletion, an eviction or a move, whose replacements start at once) waits for the lead."""
    if lead is None or p.deleting or p.notice_until is None or p.notice == REBALANCE:
        return None
    return p.notice_until - timedelta(seconds=lead)


def _later(
    d: Decision, leaving: Sequence[PodView], pods: Sequence[PodView], members: int
) -> tuple[Decision, tuple[tuple[int, datetime], ...]]:
    """(the decision, asked to look again when the first is due and told of each new leaver
    that waits; ``Decision.replace_later``). A measured lead is not waited for when more than
    half of the ``members`` are leaving: their replacements start together and take longer
    than any start the job measured, and a late swap costs a restart from storage where an
    early one costs their pod-seconds (bench/results/2026-12-02b notice120-0: 8 replacements
    created 93 s before the deadline were Ready a second after it; the job restarted, 140 s)."""
    lead = replacement_lead(d.job.spec, pods)
    el = d.job.spec.elastic
    if 2 * len(leaving) > members and (el is None or el.replacement_lead_seconds is None):
        lead = None
    later = []
    told = []
    for p in leaving:
        at = replace_at(p, lead)
        if at is None or at <= d.now:
            continue
        later.append((p.index, at))
        if p.name not in d.job.state.leaving:
            told.append((p, at))
    if not later:
        return d, ()
    d = d.also(requeue=[min((at - d.now).total_seconds() for _, at in later)])
    if told and lead is not None:
        d = d.also(
            events=[
                Event.of(
                    "ReplacingLater",
                    leaving=", ".join(f"{p.name} (node {p.node}: {p.notice})" for p, _ in told),
                    at=format_time(min(at for _, at in told)),
                    lead=f"{lead:.0f}",
                )
            ]
        )
    return d, tuple(later)


REBALANCED = "Rebalanced"
"""``PodView.disruption`` of a member moved off a crowded node once its replacement is Ready
(``torchjob/spread.py``)."""


def _taken(p: PodView) -> PodView:
    """A pod on a noticed node judged as taken (its node's notice is its disruption); a
    member that moves, as moved."""
    if p.notice_until is None or p.disruption is not None:
        return p
    return replace(p, disruption=REBALANCED if p.notice == REBALANCE else NODE_NOTICE)


def taken(current: Sequence[PodView], keep: Collection[int] = ()) -> list[PodView]:
    """The members with each on a noticed node marked taken: after a loss none of them is
    kept into the next generation (its node is going), as no evicted pod is; but those of
    ``keep`` (:func:`kept_after_loss`), which are kept to hand their state over."""
    return [_held(p) if p.index in keep else _taken(p) for p in current]


def kept_after_loss(d: Decision, current: Sequence[PodView]) -> frozenset[int]:
    """The members given notice that a loss does not take with it: the donor
    (``Decision.donor``); and, when no other member survives the loss, every leaver that may
    still train (``Decision.leaving``). They hold the state: taken with the loss, the job
    restarted at full size from storage while they had seconds to train
    (bench/results/2026-12-01s notice120-2, generation 11: two noticed nodes held every
    member, those of the first went inside their margin, the four of the second had 28 s
    left, and their replacements were not yet Ready: 49 s to the first step). Kept, they
    lead the next generation and the replacements receive the state from them; the drain
    swaps them out once their replacements are Ready. Beside other survivors, the leavers
    with time enough to train on (``joining.outlives``) are kept too: taken, they could
    leave fewer survivors than the minimum, and the job restarted at full size and waited
    for its replacements to start while they had a minute or more to train (or, on a fleet
    with no free node, waited for a node to come back); kept, the job shrinks at once and
    the replacements take their places and the lost ones' in one swap."""
    if d.donor is not None:
        return frozenset({d.donor})
    if not d.leaving:
        return frozenset()
    if not any(survives(p) for p in taken(current)):
        return frozenset(d.leaving)
    return frozenset(p.index for p in current if p.index in d.leaving and _has_time(p, d.now))


def _has_time(p: PodView, now: datetime) -> bool:
    """On a noticed node (not deleted) with time enough to train on (``joining.outlives``)."""
    return p.notice_until is not None and not p.deleting and outlives(p, now)


def formed(d: Decision) -> bool:
    """The current generation made its first step (rank 0's report, ``status.progress``), or
    the job reports none at all (no torchjob runtime in its image): its members hold the
    state, so a leaver may go."""
    got = d.job.state.progress
    return got is None or (got.generation == d.generation and got.first_step_time is not None)


def _donor(
    d: Decision, leaving: Sequence[PodView], survivors: Sequence[PodView], pods: Sequence[PodView]
) -> PodView | None:
    """Every member given notice and all but one of their replacements Ready (or all): the first
    leaver in rank order, kept one generation more beside them so that they receive the state
    from its memory (a survivor's broadcast) instead of storage. Replaced all at once, they
    restored from the last checkpoint and redid the steps since: 15-45 s per such notice
    against 6-10 s (bench/results/2026-11-30q notice120-2, 4 of 9 notices)."""
    if survivors or not leaving or d.job.spec.membership_policy != MembershipPolicy.KEEP_SURVIVORS:
        return None
    first = in_rank_order(d, leaving)[0]
    donor = next(p for p in leaving if p.index == first)
    if replace_with_standbys(d, [donor], pods) is None:
        return None
    return donor


def draining(
    d: Decision, current: Sequence[PodView], pods: Sequence[PodView]
) -> tuple[Decision, list[PodView]]:
    """(the decision, the members to judge): leavers that no ready joiner can replace yet are
    judged as members that still train, and ``d.leaving`` names them; the decision asks to be
    called again when the first one's time is up. With enough ready joiners, or no leaver,
    the members are judged as they are, a pod on a noticed node as taken: a job that does not
    drain stops it (at a checkpoint: its deletion is a SIGTERM) while its node is still there,
    and starts its successor elsewhere."""
    leaving = leavers(d, current)
    marked = taken(current)
    if not leaving:
        return d, marked
    survivors = [p for p in marked if survives(p)]  # a leaver is deleting or disrupted
    ready = formed(d)  # a generation still forming holds its state in its leavers
    # The donor first: with every replacement Ready at once (made together, they often are),
    # a swap of all of them would start the job from its last checkpoint.
    donor = _donor(d, leaving, survivors, pods) if ready else None
    if donor is not None:  # the others are judged disrupted; the donor stays a member
        d = d.but(leaving=(donor.index,), donor=donor.index)
        told = f"{donor.name} (node {donor.node}: {donor.notice})"
        d = d.also(events=[Event.of("KeepingDonor", donor=told)])
        return d, [_held(p) if p.name == donor.name else p for p in marked]
    if ready and replace_with_standbys(d, survivors, pods) is not None:
        return d, marked  # judged disrupted: a ready joiner takes each leaver's place
    waits = [
        NOTICE_RECHECK_S if _open_ended(p) else drain_left(_deadline(p), d.now) for p in leaving
    ]
    if not ready:
        waits.append(NOTICE_RECHECK_S)
    d, later = _later(d, leaving, pods, len(current))
    d = d.but(leaving=tuple(p.index for p in leaving), replace_later=later)
    d = d.also(requeue=[min(waits)])
    held = {p.name for p in leaving}
    return d, [_held(p) if p.name in held else p for p in marked]


def waited_for(d: Decision, stale: Sequence[PodView], current: Sequence[PodView]) -> list[PodView]:
    """The stale pods the current generation waits for before it creates its missing pods
    (and counts itself created, ``Decision.created_generation``): those that hold more than
    their name (``nodes.held_only``); for a ``KeepSurvivors`` job whose generation made its
    first step (rank 0's report: it restored its state, nothing a leaver still writes
    concerns it), only those whose name a missing place needs, or not yet being deleted.

    A leaver that went with a hand-over, deleted, on a node that then vanished stays
    Terminating until the node is known lost (about 40 s) or returns, and its index is not
    the new generation's. Waited for, the generation never counted itself created, so it
    could not drain (``drain.drains``), and a notice on the node of every member restarted
    the job at once, 30 s before the node went (bench/results/2026-12-02e notice30-2, +131 s:
    51 s without a step). Before the first step a leaver may still be committing the
    checkpoint the generation resumes from, and any other job's pods share the new
    generation's names and checkpoint: they are waited for."""
    left = [p for p in stale if not held_only(p, d.now)]
    trained = d.job.state.progress is not None and formed(d)  # a report, of this generation
    if d.job.spec.membership_policy != MembershipPolicy.KEEP_SURVIVORS or not trained:
        return left
    have = {p.index for p in current}
    needed = {i for i in d.ranked if i not in have}
    return [p for p in left if p.index in needed or not p.deleting]


def _held(p: PodView) -> PodView:
    """A leaver judged as a member that still trains."""
    return replace(p, deleting=False, disruption=None, notice_until=None)


__all__ = [
    "LEAD_FACTOR",
    "LEAD_SLACK_S",
    "MARGIN_S",
    "REBALANCE",
    "REBALANCED",
    "draining",
    "drains",
    "formed",
    "kept_after_loss",
    "leavers",
    "replace_at",
    "replacement_lead",
    "taken",
    "waited_for",
]
