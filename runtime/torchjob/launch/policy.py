"""Pure decisions of the local controller: restart, shrink, grow or give up.

Ray Train V2's split: policies return decision *values*; the controller
(``torchjob.train.controller.Controller``) carries them out. The rules themselves are
``torchjob.rules``'s, the ones the operator and ``torchjob run`` use: what a lost worker
was (``classify``: the one loss model), what it costs (``decide_restart``: restart budget,
backoff, counters, shrinking, over ``ElasticRules``) and when a shrunk group grows back
(``grow_back``); this module maps worker processes' failures onto them and keeps the
counters the decision moved (never recomputes them). Policies hold configuration only;
the counters live in the :class:`RunState` passed in, so ``decide`` gives the same answer
for the same inputs and every branch is unit-testable without processes.

What a loss costs is the operator's too (docs/architecture.md, "What each loss costs"): a
worker killed by a signal it does not send itself (SIGKILL with no OOM evidence, SIGTERM,
SIGINT, SIGHUP: a lost machine, a ``kill -9``) is a disruption, never charged; an elastic
group (``min_workers < max_workers``) re-forms with one worker fewer while ``min_workers``
remain, and otherwise at the same size. An exception, a non-zero exit, a hung collective or
an OOM kill is a failure: it consumes ``max_failures``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from torchjob.launch.errors import (
    CollectiveTimeoutError,
    LaunchError,
    WorkerDiedError,
    WorkerGroupError,
)
from torchjob.rules import (
    Counters,
    ElasticRules,
    Failure,
    Loss,
    Noop,
    Recovery,
    Resize,
    RestartRules,
    ScalingDecision,
    Verdict,
    classify,
    decide_restart,
    grow_back,
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
    exit_code: int | None = None
    """Its own exit code (``kind == DIED`` without a signal)."""
    oom: bool = False
    """The OOM killer's evidence (the cgroup's ``oom_kill`` counter moved)."""

    @property
    def loss(self) -> Loss:
        """The loss (``torchjob.rules.classify``): a worker that died is classified by how; an
        exception or a hang is the job's own failure."""
        if self.kind is FailureKind.DIED:
            seen = classify(ended=True, exit_code=self.exit_code, signal=self.signal, oom=self.oom)
            if seen is not None:
                return seen
        return Failure(self.exit_code)


@dataclass(frozen=True)
class RunState:
    """Everything a decision depends on. The controller builds a new one after each step."""

    num_workers: int
    generation: int = 0
    failures: int = 0
    """Failures charged against ``max_failures`` so far."""
    disruptions: int = 0
    """Worker losses that were not charged."""
    checkpoints_in_generation: int = 0
    """Checkpoints committed since this generation started (progress to keep before a resize)."""
    generation_started_s: float = 0.0
    survivors_hold_state: bool = False
    """After a failure: some workers outlive it, can re-form in place and hold the last
    completed step's state in memory (``torchjob.train.recovery.restore_point``)."""

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
    counters: Counters
    """The counters ``decide_restart`` moved: the next generation adopts them as they are."""
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
    """A local worker group's failure policy: whether a generation's loss restarts the
    group, shrinks it, or ends the run (the TorchJob CRD's is ``api.models.FailurePolicy``)."""

    max_failures: int | None
    """Charged failures allowed; ``None`` is unlimited (Ray's ``max_failures=-1``)."""
    elastic: ElasticRules
    """``min_workers`` .. ``max_workers`` (``ScalingConfig``)."""

    def decide(self, state: RunState, failure: WorkerFailure) -> GroupFailureDecision:
        # The job rules' decision (torchjob.rules.decide_restart) over the loss, with the
        # local budget (no backoff, no exit-code classes).
        d = decide_restart(
            state.counters,
            RestartRules(max_restarts=self.max_failures),
            failure.loss,
            workers=state.num_workers,
            elastic=self.elastic,
            survivors_hold_state=state.survivors_hold_state,
        )
        from_memory = d.recovery is Recovery.MEMORY
        where = "; the survivors' memory is the restore point" if from_memory else ""
        lost = f"rank {failure.rank} lost ({failure.message})"
        if d.verdict is Verdict.DISRUPTED:
            size = "shrinking" if d.shrunk else "the same size"
            return RestartGroup(
                num_workers=d.workers,
                reason=f"{lost}; {size}, not charged{where}",
                charged=False,
                from_memory=from_memory,
                counters=d.counters,
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
            counters=d.counters,
        )


@dataclass(frozen=True)
class GroupScalingPolicy:
    """A local worker group's grow-back policy: ``torchjob.rules.grow_back`` over a
    :class:`RunState`."""

    elastic: ElasticRules

    def decide_for(
        self, state: RunState, *, now_s: float, available_workers: int
    ) -> ScalingDecision:
        return grow_back(
            self.elastic,
            num_workers=state.num_workers,
            available_workers=available_workers,
            checkpoints_in_generation=state.checkpoints_in_generation,
            generation_age_s=now_s - state.generation_started_s,
        )


def next_generation(
    state: RunState, num_workers: int, counters: Counters, *, now_s: float
) -> RunState:
    """The state of the generation that follows a restart or resize, with ``counters`` as the
    decision moved them (``RestartGroup.counters``; a resize: ``state.counters.resized()``)."""
    return replace(
        state,
        num_workers=num_workers,
        generation=counters.generation,
        failures=counters.restarts,
        disruptions=counters.disruptions,
        checkpoints_in_generation=0,
        generation_started_s=now_s,
        survivors_hold_state=False,
    )


def as_failure(err: LaunchError) -> WorkerFailure:
    """A launch error reduced to its root cause, for the failure policy."""
    if isinstance(err, WorkerDiedError):
        code = err.exitcode if err.signal is None else None
        why = str(err).split(": ", 1)[-1]
        return WorkerFailure(err.rank, FailureKind.DIED, why, err.signal, code, err.oom)
    if isinstance(err, CollectiveTimeoutError):
        return WorkerFailure(err.rank, FailureKind.TIMEOUT, "hung in a collective")
    if isinstance(err, WorkerGroupError):
        return WorkerFailure(err.rank, FailureKind.ERROR, f"{err.exc_type}: {err.message}")
    return WorkerFailure(0, FailureKind.ERROR, str(err))
