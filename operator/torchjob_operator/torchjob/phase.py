"""Phase derivation for a live generation: Pending -> Starting -> Running, and why not."""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.api.models import Phase
from torchjob_operator.common import conditions as cond
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.observed import (
    IMAGE_PULL_REASONS,
    PodPhase,
    PodView,
)


def active_phase(d: Decision, current: Sequence[PodView]) -> Decision:
    """Pending -> Starting -> Running for a live generation; Restarting holds until it runs again."""
    # A member given notice still trains while its replacement starts (``drain``).
    alive = [p for p in current if not p.deleting or p.index in d.leaving]
    running = sum(1 for p in alive if p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED))
    ready = sum(
        1
        for p in alive
        if (p.phase == PodPhase.RUNNING and p.ready) or p.phase == PodPhase.SUCCEEDED
    )
    if len(alive) == d.replicas and running == d.replicas:
        return d.transition(
            Phase.RUNNING,
            "AllWorkersRunning",
            cond.message("AllWorkersRunning", replicas=d.replicas, generation=d.generation),
        )
    scheduled = sum(1 for p in alive if p.scheduled)
    phase = Phase.STARTING if alive and scheduled == d.replicas else Phase.PENDING
    stuck = [p for p in alive if p.waiting]
    if stuck:
        # Never resolves on its own (a wrong image, a missing Secret): say so, with a Warning.
        first = stuck[0]
        reason = (
            "ImagePullFailed" if first.waiting in IMAGE_PULL_REASONS else "ContainerCannotStart"
        )
        detail = (
            f"{first.waiting}: {first.waiting_message}" if first.waiting_message else first.waiting
        )
        return d.transition(
            Phase.RESTARTING if d.phase == Phase.RESTARTING else phase,
            *cond.say(reason, stuck=len(stuck), replicas=d.replicas, pod=first.name, detail=detail),
            warning=True,
        )
    if d.phase == Phase.RESTARTING:
        return d
    unschedulable = [p for p in alive if p.unschedulable_since is not None]
    if unschedulable:
        first = unschedulable[0]
        return d.transition(
            phase,
            *cond.say(
                "Unschedulable",
                count=len(unschedulable),
                replicas=d.replicas,
                pod=first.name,
                detail=first.message or "Unschedulable",
            ),
        )
    return d.transition(
        phase,
        "WaitingForPods",
        cond.message("WaitingForPods", ready=ready, replicas=d.replicas),
    )
