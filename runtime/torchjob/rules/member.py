"""What a launcher observes of one worker, and the judgement of a generation.

A ``Member`` is a worker pod (``torchjob_operator.torchjob.observed.PodView``) or a local
process (``torchjob.client.local``): both say whether it runs and, through the one
classifier (``torchjob.rules.loss.classify``), how it was lost (``Member.loss``): taken
away (a disruption, a silent peer, stopped as asked: never charged) or failed on its own.

``judge_generation`` looks at *all* members of the current generation before it
decides, because a peer's crash (NCCL/gloo error when a neighbour vanished) is often
seen before the preempted pod's DisruptionTarget condition. Any disruption in the
generation makes the whole event a disruption, which never consumes the restart
budget.

Among failed members, one whose runtime said it failed only because a peer did
(``peer_failure``, from the termination message) is never blamed while another
failed member explains it; and while *every* failed member blames a peer and others
still run, the judgement waits up to ``ROOT_CAUSE_GRACE`` for the one that raised to
exit too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Protocol

from torchjob.rules.loss import Disruption, Failure, Loss, Silent, Stopped


class MemberPhase(str, Enum):
    """A worker's lifecycle (the values are Kubernetes pod phases)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class Member(Protocol):
    """One worker of a generation, as every launcher's judgement needs it."""

    @property
    def name(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def phase(self) -> MemberPhase: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def reason(self) -> str:
        """How it ended (``Error``, ``OOMKilled`` ...); '' while it runs."""
        ...

    @property
    def loss(self) -> Loss | None:
        """How it was lost (``torchjob.rules.loss.classify`` over what the launcher saw);
        None while it runs or once it succeeded."""
        ...

    @property
    def deleting(self) -> bool:
        """Someone is taking it away right now (a pod with a deletionTimestamp)."""
        ...

    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def summary(self) -> str:
        """One line on why it stopped, from its termination message."""
        ...

    @property
    def peer_failure(self) -> bool:
        """Its runtime said it failed only because a peer did (not a root cause)."""
        ...

    @property
    def active(self) -> bool:
        """Still running or about to (not finished, not being taken away)."""
        ...


class Outcome(str, Enum):
    HEALTHY = "Healthy"
    """Nothing lost: keep going."""
    SUCCEEDED = "Succeeded"
    """Every worker of the generation exited 0."""
    DISRUPTED = "Disrupted"
    """A worker was taken away (preemption, eviction, node loss, deletion by someone else, a
    kill from outside), went silent, or stopped as asked: never charged."""
    FAILED = "Failed"
    """A worker failed on its own (a non-zero exit, an OOM kill): charged."""
    AWAITING_ROOT_CAUSE = "AwaitingRootCause"
    """Failed members only blame a peer that still runs: wait briefly for its own failure."""


ROOT_CAUSE_GRACE = timedelta(seconds=10)
"""How long failed members that blame a peer wait for that peer's own exit before one is blamed."""


@dataclass(frozen=True)
class Judgement:
    outcome: Outcome
    culprit: Member | None = None
    """The member the outcome is blamed on: the disrupted one, or the first one that failed."""
    detail: str = ""
    loss: Loss | None = None
    """What was lost, for ``decide_restart`` (DISRUPTED and FAILED only): the culprit's loss,
    or a ``Disruption`` for a member that vanished or is being deleted."""
    recheck_after_s: float | None = None
    """For AWAITING_ROOT_CAUSE: judge again after this many seconds at the latest."""


def _first_failed(members: Sequence[Member]) -> Member:
    """Root cause: the earliest non-zero exit; ties and unknown times by index."""
    far = datetime.max.replace(tzinfo=None)
    return min(
        members,
        key=lambda p: (
            p.finished_at.replace(tzinfo=None) if p.finished_at else far,
            p.index,
        ),
    )


def judge_generation(
    members: Sequence[Member],
    *,
    replicas: int,
    missing: Sequence[int] = (),
    now: datetime | None = None,
) -> Judgement:
    """Classify the state of the current generation.

    ``members`` are the workers of the current generation; ``missing`` the indices
    that were started and have since vanished. Without ``now`` a failure is judged at
    once (no waiting for a root cause).
    """
    disrupted = [p for p in members if _taken(p.loss) or p.deleting]
    if disrupted:
        # A member with a known reason explains the event better than one that merely
        # vanished, and one taken away better than one that stopped as asked.
        culprit = min(disrupted, key=lambda p: (_rank(p.loss), p.index))
        loss = culprit.loss if _taken(culprit.loss) else Disruption("deleted by another client")
        assert loss is not None
        return Judgement(Outcome.DISRUPTED, culprit, f"{culprit.name}: {loss.why}", loss)
    if missing:
        gone = Disruption(f"worker {missing[0]} was deleted")
        return Judgement(Outcome.DISRUPTED, None, gone.reason, gone)
    failed = [p for p in members if isinstance(p.loss, Failure)]
    if failed:
        own = [p for p in failed if not p.peer_failure]
        if not own and now is not None:
            wait = _root_cause_wait(failed, members, now)
            if wait is not None:
                return Judgement(
                    Outcome.AWAITING_ROOT_CAUSE,
                    detail=f"{len(failed)} worker(s) failed because of a peer",
                    recheck_after_s=wait,
                )
        culprit = _first_failed(own or failed)
        code = "unknown" if culprit.exit_code is None else str(culprit.exit_code)
        why = culprit.reason or "Error"
        detail = f"{culprit.name} exited with code {code} ({why})"
        if culprit.summary:
            detail += f": {culprit.summary[:300]}"
        return Judgement(Outcome.FAILED, culprit, detail, culprit.loss)
    if len(members) == replicas and all(p.phase == MemberPhase.SUCCEEDED for p in members):
        return Judgement(Outcome.SUCCEEDED)
    return Judgement(Outcome.HEALTHY)


def _taken(loss: Loss | None) -> bool:
    """Lost without a fault of its own: taken away, silent, or stopped as asked."""
    return isinstance(loss, Disruption | Silent | Stopped)


def _rank(loss: Loss | None) -> int:
    """Which member explains a disruption best: taken away or silent, then stopped as asked
    (it stopped because of another's loss), then merely being deleted."""
    if isinstance(loss, Disruption | Silent):
        return 0
    return 1 if isinstance(loss, Stopped) else 2


def _root_cause_wait(
    failed: Sequence[Member], members: Sequence[Member], now: datetime
) -> float | None:
    """Seconds left to wait for a still-running peer to report its own failure, or None."""
    if not any(p.active for p in members):
        return None
    times = [p.finished_at for p in failed if p.finished_at is not None]
    if not times:
        return None
    left = (min(times) + ROOT_CAUSE_GRACE - now).total_seconds()
    return left if left > 0 else None
