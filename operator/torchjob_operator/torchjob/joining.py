"""Which pods wait to join a later generation, and in which order. Pure.

Those on nodes given notice come last (:func:`join_order`): a generation's places and the
cap on joiners (``elastic.joiner_room``) go to the others first. Taken by index, four
replacements placed on a node noticed since went into generation 4 of
bench/results/2026-12-03c, and a fifth, on a node with no notice, was deleted as beyond the
cap.

A joiner whose own node has been given notice since it was placed waits to join only while it
has :data:`MIN_NOTICED_JOINER_S` or more left (:func:`outlives`): after that it is stale (it
goes, and another is started off the noticed nodes at once), as a hand-over to pods about to
go swaps the state onto them for nothing. In bench/results/2026-12-05d (+150 s, a 30 s
notice on the node of every member) the eight replacements' node was noticed 4.5 s after
it; once Ready, 14 s before their own deadline, they took every place in one hand-over,
the members were deleted mid-step without their checkpoint, and the job restarted from
storage with 6 steps done again. Left out, the members train on to their drain and stop at
a checkpoint (their SIGTERM), and the job starts again from it.

Pods a generation left out are leavers, never joiners again (:func:`former_member`).
A replacement is created ahead of the generation that takes it in, labelled
``contract.LABEL_JOINER`` (``elastic.joiners``), and keeps that label for life:
``drain.replacement_lead`` reads it to learn how long a replacement takes to start. Once
such a pod has been a member and a later generation leaves it out (a noticed node's member
replaced by a ready joiner, its deletion a pass away), it is on its way out, not waiting to
join. Taken for a waiting joiner, it was not deleted, and the next generation took it back in:
bench/results/2026-12-03c, where generations 4 to 7 swapped the same pods between two
noticed nodes within 9 s and the job trained again 66 s after the notice.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from torchjob import contract
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.observed import PodView


def left_out(d: Decision) -> dict[str, int]:
    """Pod name -> the latest generation that left it out: ``status.history``'s ``left``;
    and, in the pass that publishes a generation (its record is not written yet), the
    status's members that the new generation does not rank."""
    out: dict[str, int] = {}
    for record in d.job.state.history:
        for entry in record.left or ():
            name = entry.partition("@")[0]
            out[name] = max(record.generation, out.get(name, -1))
    state = d.job.state
    if d.generation > state.generation:
        ranked = set(d.ranked)
        for i in state.members if state.members is not None else range(state.replicas):
            if i not in ranked:
                out[contract.worker_pod_name(d.job.name, i)] = d.generation
    return out


def former_member(p: PodView, left: Mapping[str, int]) -> bool:
    """``p`` was a member before a generation that left it out: its generation label is
    older than that generation (a pod of the same name created since, once the leaver was
    gone, is labelled with a later one)."""
    return left.get(p.name, -1) > p.generation


MIN_NOTICED_JOINER_S = 30.0
"""A joiner given notice waits to join only with this long to its node's deadline: the
operator's margin (``rules.drain.MARGIN_S``, 10 s) and a re-formation with a few steps after
it, so that a swap is worth its cost (a 30 s notice on the joiner's node always fails it)."""


def outlives(p: PodView, now: datetime) -> bool:
    """``p`` has no notice, or :data:`MIN_NOTICED_JOINER_S` or more before its deadline."""
    return p.notice_until is None or (p.notice_until - now).total_seconds() >= MIN_NOTICED_JOINER_S


def join_order(p: PodView) -> tuple[bool, float, int]:
    """Sort key: joiners on nodes without a notice first, then the latest deadline, then by
    index."""
    until = -p.notice_until.timestamp() if p.notice_until is not None else 0.0
    return (p.notice_until is not None, until, p.index)


__all__ = ["MIN_NOTICED_JOINER_S", "former_member", "join_order", "left_out", "outlives"]
