"""Replace before leaving (``torchjob.rules.drain``), in Kubernetes terms. Pure.

A member pod given notice (``deletionTimestamp`` set by a graceful delete, or the
``DisruptionTarget`` condition the Eviction API writes just before it) whose container still
runs is a *leaver*: while its deadline is more than ``MARGIN_S`` away and no ready joiner can
take its place, the generation is judged as if it were not leaving (it still trains), and
``elastic.grow_with_joiners`` creates its replacement at once under a free pod index. Once a
joiner is Ready the leaver is judged disrupted, and ``elastic.replace_with_standbys`` puts the
joiner in its place: one generation, one re-formation, at full size. A leaver whose time runs
out first is judged disrupted as before (``shrinkOnDisruption``, a full-size replacement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from torchjob.api.models import MembershipPolicy
from torchjob.rules.drain import MARGIN_S, drain_left
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.elastic import replace_with_standbys
from torchjob_operator.torchjob.loss import survives
from torchjob_operator.torchjob.observed import PodPhase, PodView

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


def leavers(d: Decision, current: Sequence[PodView]) -> tuple[PodView, ...]:
    """Members given notice that still train and may go on doing so."""
    if not drains(d):
        return ()
    return tuple(
        p
        for p in current
        if p.phase == PodPhase.RUNNING
        and p.scheduled
        and (p.deleting or p.disruption is not None)
        and (not p.deleting or drain_left(p.deletion_at, d.now) > 0)
    )


def draining(
    d: Decision, current: Sequence[PodView], pods: Sequence[PodView]
) -> tuple[Decision, list[PodView]]:
    """(the decision, the members to judge): leavers that no ready joiner can replace yet are
    judged as members that still train, and ``d.leaving`` names them; the decision asks to be
    called again when the first one's time is up. With enough ready joiners, or no leaver,
    ``current`` is judged as it is."""
    leaving = leavers(d, current)
    if not leaving:
        return d, list(current)
    survivors = [p for p in current if survives(p)]  # a leaver is deleting or disrupted
    if replace_with_standbys(d, survivors, pods) is not None:
        return d, list(current)  # judged disrupted: a ready joiner takes each leaver's place
    waits = [drain_left(p.deletion_at, d.now) if p.deleting else NOTICE_RECHECK_S for p in leaving]
    d = d.but(leaving=tuple(p.index for p in leaving)).also(requeue=[min(waits)])
    held = {p.name for p in leaving}
    return d, [
        replace(p, deleting=False, disruption=None) if p.name in held else p for p in current
    ]


__all__ = ["MARGIN_S", "draining", "drains", "leavers"]
