"""Generations and the counters every decision moves, and the deadline clock.

Every membership change starts generation g+1: a failure restart charges the restart
budget (``restarts``), a disruption never does (``disruptions``), a resize (a user's
scale, an elastic shrink or grow, a resume) charges neither. The operator keeps these
counters in the TorchJob status; local launchers keep them in memory. Same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from torchjob.api.models import TorchJobStatus


@dataclass(frozen=True)
class Counters:
    generation: int = 0
    restarts: int = 0
    """Group restarts charged to the restart budget (failures)."""
    disruptions: int = 0
    """Membership changes the cluster caused (never charged)."""

    @classmethod
    def from_status(cls, status: TorchJobStatus | None) -> Counters:
        s = status or TorchJobStatus()
        return cls(
            generation=s.current_generation or 0,
            restarts=s.restarts or 0,
            disruptions=s.disruptions or 0,
        )

    def restarted(self) -> Counters:
        """After a failure restart (``decide_restart``'s RESTART_GROUP): one restart charged."""
        return replace(self, generation=self.generation + 1, restarts=self.restarts + 1)

    def disrupted(self) -> Counters:
        """After a disruption: counted, charged to no budget."""
        return replace(self, generation=self.generation + 1, disruptions=self.disruptions + 1)

    def resized(self) -> Counters:
        """After a resize (a user's scale, an elastic shrink or grow, a resume): charged to no
        counter."""
        return replace(self, generation=self.generation + 1)


def deadline_left(
    active_deadline_seconds: int | None, start_time: datetime | None, now: datetime
) -> float | None:
    """Seconds until ``activeDeadlineSeconds`` (from ``start_time``) expires: <= 0 once it
    has, None when there is no deadline (or the clock has not started)."""
    if active_deadline_seconds is None or start_time is None:
        return None
    # No datetime arithmetic with the deadline: it may be int64's maximum (a common "never").
    return (start_time - now).total_seconds() + active_deadline_seconds
