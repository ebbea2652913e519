"""Pure decisions of the local controller: restart, shrink, grow or give up.

Ray Train V2's split: policies return decision *values*; the controller
(``torchjob.train.controller.Controller``) carries them out. The rules themselves
(``decide_restart``: restart budget, backoff, counters, shrinking; growing back) are
``torchjob.rules``'s, the ones the operator and ``torchjob run`` use; this module maps
worker processes' failures onto them. Policies hold configuration
only. Counters (failures charged, generation, reports) live in the
:class:`RunState` passed in, so ``decide`` gives the same answer for the same
inputs and every branch is unit-testable without processes.

Failure vs disruption (DESIGN.md section 4): in an elastic run a worker that is
*killed* (a signal, as when a machine or pod is lost) is a disruption: the group
re-forms with one worker fewer and the failure budget is not charged. An
exception, a non-zero exit or a hung collective is a failure: it consumes
``max_failures``. Without elasticity every loss restarts the whole group at the
same size and is charged, as in Ray Train.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from torchjob.rules import (
    Counters,
    Noop,
    Recovery,
    Resize,
    RestartRules,
    Verdict,
    decide_restart,
    killed_from_outside,
    resize,
)

__all__ = [
    "Fail",
    "FailureKind",
    "GroupFailureDecision",
    "GroupFailurePolicy",
    "GroupScalingPolicy",
    "Noop",
    "Resize",
    "RestartGroup",
    "RunState",
    "WorkerFailure",
    "next_generation",
]


class FailureKind(enum.Enum):
    ERROR = "error"
    """Training code raised."""
    DIED = "died"
    """A worker process exited or was killed."""
    TIMEOUT = "timeout"
    """A collective timed out (a rank hung)."""


@dataclass(frozen=True)
class WorkerFailure:
    """What went wrong in a generation, reduced to its root cause."""

    rank: int
    kind: FailureKind
    message: str
    signal: int | None = None
    """Signal that killed the worker (``kind == DIED`` only)."""

    @property
    def killed(self) -> bool:
        """The process was killed from outside (lost machine, OOM killer, preemption)."""
        return self.kind is FailureKind.DIED and killed_from_outside(self.signal)


@dataclass(frozen=True)
class RunState:
    """Everything a decision depends on. The controller builds a new one after each step."""

    num_workers: int
    generation: int = 0
    failures: int = 0
    """Failures charged against ``max_failures`` so far."""
    disruptions: int = 0
    """Worker losses that were not charged (elastic shrink)."""
    checkpoints_in_generation: int = 0
    """Checkpoints committed since this generation started (progress to keep before a resize)."""
    generation_started_s: float = 0.0
    survivors_hold_state: bool = False
    """After a failure: some workers outlive it, can re-form in place and hold the last
    completed step's state in memory (``torchjob.train.restore_point``)."""

    @property
    def counters(self) -> Counters:
        """The job rules' counters (``failures`` are the restarts charged)."""
        return Counters(self.generation, self.failures, self.disruptions)


@dataclass(frozen=True)
class RestartGroup:
    """Start generation g+1 with ``num_workers`` from the latest committed checkpoint."""

    num_workers: int
    reason: str
    charged: bool
    backoff_s: float = 0.0
    from_memory: bool = False
    """The survivors re-form in place and restore from their memory, not from storage."""


@dataclass(frozen=True)
class Fail:
    """Give up: the run ends with this error."""

    reason: str


GroupFailureDecision = RestartGroup | Fail
"""What a local worker group does after a failure (``GroupFailurePolicy.decide``)."""


@dataclass(frozen=True)
class GroupFailurePolicy:
    """A local worker group's failure policy: whether a generation's failure restarts the
    group, shrinks it, or ends the run (the TorchJob CRD's is ``api.models.FailurePolicy``)."""

    max_failures: int | None
    """Charged failures allowed; ``None`` is unlimited (Ray's ``max_failures=-1``)."""
    min_workers: int
    max_workers: int

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.max_workers

    def decide(self, state: RunState, failure: WorkerFailure) -> GroupFailureDecision:
        # The job rules' decision (torchjob.rules.decide_restart): in an elastic group a worker
        # killed from outside is a disruption that shrinks the group, never charged, while
        # the group stays at or above min_workers; anything else is a charged failure (no
        # backoff, no exit-code classes).
        d = decide_restart(
            state.counters,
            RestartRules(max_restarts=self.max_failures),
            disrupted=self.elastic and failure.killed,
            workers=state.num_workers,
            shrink_floor=self.min_workers,
            survivors_hold_state=state.survivors_hold_state,
            killed=failure.killed,
        )
        from_memory = d.recovery is Recovery.MEMORY
        where = "; the survivors' memory is the restore point" if from_memory else ""
        if d.verdict is Verdict.DISRUPTED:
            return RestartGroup(
                num_workers=d.workers,
                reason=f"rank {failure.rank} lost ({failure.message}); shrinking, not "
                f"charged{where}",
                charged=False,
                from_memory=from_memory,
            )
        if not d.restarts:
            return Fail(
                reason=f"rank {failure.rank} failed ({failure.message}) and the failure budget "
                f"is spent: max_failures={self.max_failures}"
            )
        n = d.counters.restarts
        left = None if self.max_failures is None else self.max_failures - n
        budget = "unlimited" if left is None else f"{left} left"
        return RestartGroup(
            num_workers=d.workers,
            reason=f"rank {failure.rank} failed ({failure.message}); restart {n} charged, "
            f"{budget}{where}",
            charged=True,
            backoff_s=d.backoff_s,
            from_memory=from_memory,
        )


@dataclass(frozen=True)
class GroupScalingPolicy(resize.ScalingPolicy):
    """A local worker group's scaling policy: ``torchjob.rules.ScalingPolicy`` over a
    :class:`RunState`."""

    def decide_for(
        self, state: RunState, *, now_s: float, available_workers: int
    ) -> resize.ScalingDecision:
        return self.decide(
            num_workers=state.num_workers,
            checkpoints_in_generation=state.checkpoints_in_generation,
            generation_age_s=now_s - state.generation_started_s,
            available_workers=available_workers,
        )


def next_generation(state: RunState, num_workers: int, *, charged: bool, now_s: float) -> RunState:
    """The state of the generation that follows a restart or resize (``torchjob.rules.Counters``:
    a charged restart counts a failure, a shrink a disruption, a grow neither)."""
    c = state.counters
    if charged:
        c = c.restarted()
    elif num_workers < state.num_workers:
        c = c.disrupted()
    else:
        c = c.resized()
    return replace(
        state,
        num_workers=num_workers,
        generation=c.generation,
        failures=c.restarts,
        disruptions=c.disruptions,
        checkpoints_in_generation=0,
        generation_started_s=now_s,
        survivors_hold_state=False,
    )
