"""Replace before leaving: a worker pod given notice trains on while its replacement starts.

A graceful preemption (the Eviction API, a scheduler's preemption, a node drain, a spot
notice turned into a deletion) gives a pod its grace period between SIGTERM and SIGKILL. An
elastic ``KeepSurvivors`` job spends it training: the operator creates the replacement at
once (under a new pod index, since the leaving pod still holds its name), and when the
replacement is Ready publishes one generation with the replacement in the leaving pod's
place. The group re-forms once, at full size, with no stretch at one worker short. The
leaving pod's runtime trains on for at most ``drain_seconds(grace)`` after SIGTERM, then
stops as it always did; the operator stops counting on it ``MARGIN_S`` before the kubelet's
SIGKILL and shrinks the group instead, so a replacement that is slow to start costs what it
cost before, never a hard loss.

Shared by the operator (``torchjob_operator.torchjob.drain``) and the runtime
(``torchjob.train.controller``); pure, standard library only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

MARGIN_S: Final = 10.0
"""Seconds before the kubelet's SIGKILL at which a leaving pod stops training: the group
stops at a report and re-forms without it, with time to spare for a slow step."""


def drain_seconds(grace_s: int | None) -> int:
    """How long a worker pod with ``terminationGracePeriodSeconds`` ``grace_s`` trains on
    after SIGTERM: the grace period less ``MARGIN_S``, 0 (stop at once) when that leaves
    less than ``MARGIN_S``."""
    if grace_s is None or grace_s < 2 * MARGIN_S:
        return 0
    return int(grace_s - MARGIN_S)


def drain_left(deletion_at: datetime | None, now: datetime) -> float:
    """Seconds a pod deleted with deadline ``deletion_at`` (its ``deletionTimestamp``: the
    request's time plus its grace period) may still train; 0 once inside the margin or
    without a deadline."""
    if deletion_at is None:
        return 0.0
    left = (deletion_at - now).total_seconds() - MARGIN_S
    return max(left, 0.0)
