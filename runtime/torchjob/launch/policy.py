"""Pure decisions of the local controller: restart, shrink, grow or give up.

Ray Train V2's split: policies return decision *values*; the controller
(``torchjob.train._controller``) carries them out. Policies hold configuration
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
import signal
from dataclasses import dataclass, replace


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
        return self.kind is FailureKind.DIED and self.signal in (
            signal.SIGKILL,
            signal.SIGTERM,
            signal.SIGINT,
            signal.SIGHUP,
        )


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


@dataclass(frozen=True)
class RestartGroup:
    """Start generation g+1 with ``num_workers`` from the latest committed checkpoint."""

    num_workers: int
    reason: str
    charged: bool
    backoff_s: float = 0.0


@dataclass(frozen=True)
class Resize:
    """Stop the running generation at its next checkpoint and re-form it with ``num_workers``."""

    num_workers: int
    reason: str


@dataclass(frozen=True)
class Fail:
    """Give up: the run ends with this error."""

    reason: str


@dataclass(frozen=True)
class Noop:
    """Keep going."""


FailureDecision = RestartGroup | Fail
ScalingDecision = Resize | Noop


@dataclass(frozen=True)
class FailurePolicy:
    """Whether a generation's failure restarts the group, shrinks it, or ends the run."""

    max_failures: int | None
    """Charged failures allowed; ``None`` is unlimited (Ray's ``max_failures=-1``)."""
    min_workers: int
    max_workers: int
    backoff_s: float = 0.0

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.max_workers

    def budget_left(self, state: RunState) -> int | None:
        if self.max_failures is None:
            return None
        return max(0, self.max_failures - state.failures)

    def decide(self, state: RunState, failure: WorkerFailure) -> FailureDecision:
        if self.elastic and failure.killed and state.num_workers - 1 >= self.min_workers:
            return RestartGroup(
                num_workers=state.num_workers - 1,
                reason=f"rank {failure.rank} lost ({failure.message}); shrinking, not charged",
                charged=False,
            )
        left = self.budget_left(state)
        if left is not None and left <= 0:
            return Fail(
                reason=f"rank {failure.rank} failed ({failure.message}) and the failure budget "
                f"is spent: max_failures={self.max_failures}"
            )
        budget = "unlimited" if left is None else f"{left - 1} left"
        return RestartGroup(
            num_workers=state.num_workers,
            reason=f"rank {failure.rank} failed ({failure.message}); restart {state.failures + 1} "
            f"charged, {budget}",
            charged=True,
            backoff_s=self.backoff_s,
        )


@dataclass(frozen=True)
class ScalingPolicy:
    """When a shrunk elastic group grows back toward ``max_workers``.

    It grows once the current generation committed at least one checkpoint (so
    the resize loses no work) and ``grow_cooldown_s`` passed since it started (so
    flapping capacity cannot thrash).
    """

    min_workers: int
    max_workers: int
    grow_cooldown_s: float = 0.0

    def decide(self, state: RunState, *, now_s: float, available_workers: int) -> ScalingDecision:
        target = min(self.max_workers, available_workers)
        if target <= state.num_workers:
            return Noop()
        if state.checkpoints_in_generation < 1:
            return Noop()
        if now_s - state.generation_started_s < self.grow_cooldown_s:
            return Noop()
        return Resize(
            num_workers=target,
            reason=f"capacity for {target} workers (running {state.num_workers}); growing back",
        )


def next_generation(state: RunState, num_workers: int, *, charged: bool, now_s: float) -> RunState:
    """The state of the generation that follows a restart or resize."""
    killed_not_charged = not charged and num_workers < state.num_workers
    return replace(
        state,
        num_workers=num_workers,
        generation=state.generation + 1,
        failures=state.failures + (1 if charged else 0),
        disruptions=state.disruptions + (1 if killed_not_charged else 0),
        checkpoints_in_generation=0,
        generation_started_s=now_s,
    )
