"""The planner's values: what it is given (``JobView``), what it answers (``Plan``), and
the scratch state of one decision (``Draft``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchjob.api.models import FailureRecord, Phase, TorchJobSpec
from torchjob.plan import Counters
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.kueue import Gate
from torchjob_operator.torchjob.observed import JobState, ProbeView


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    spec: TorchJobSpec
    state: JobState = field(default_factory=JobState)
    metadata_generation: int | None = None
    foreign_pods: tuple[str, ...] = ()
    """Pods with this job's name label whose controller is another uid (an earlier TorchJob of
    this name, being deleted): never judged, counted or deleted; while one exists no pod is
    created, since a new pod would share its name and DNS name."""
    kueue: Gate | None = None
    """The job's Kueue Workload (planner/kueue.py); None: Kueue does not manage the job."""


@dataclass(frozen=True)
class CreatePods:
    indices: tuple[int, ...]
    generation: int
    replicas: int
    joiners: bool = False
    """Created ahead of ``generation`` (not yet published): an elastic job's replacements."""
    members: tuple[int, ...] | None = None
    """The rank order of ``generation`` when it is not ``0..replicas-1`` (see ``Draft.members``)."""


@dataclass(frozen=True)
class Plan:
    create: CreatePods | None
    delete: tuple[str, ...]
    status: dict[str, Any]
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None
    delete_job: bool = False
    ensure_service: bool = True
    create_probes: tuple[int, ...] = ()
    """Capacity probes to create (indices) before an elastic job grows."""
    relabel: tuple[str, ...] = ()
    """KeepSurvivors: pods kept from an earlier generation, to label with the current one."""

    @property
    def phase(self) -> Phase:
        return Phase(self.status["phase"])


@dataclass
class Draft:
    """Mutable scratch state while one plan is being decided."""

    job: JobView
    now: datetime
    phase: Phase | None
    generation: int
    replicas: int
    restarts: int
    disruptions: int
    start_time: datetime | None
    completion_time: datetime | None
    restart_after: datetime | None
    created_generation: int | None
    last_failure: FailureRecord | None
    members: tuple[int, ...] | None = None
    """KeepSurvivors: the current generation's pod indices in rank order, when they are not
    ``0..replicas-1``: survivors first, in their old rank order, then new pods. A generation
    that lost pod 0 goes on with a survivor as rank 0 and the rendezvous on it."""
    standby_ready: int | None = None
    """Joiners ready to take a worker's place (``status.standbyWorkers``; None: not elastic)."""
    spec_replicas: int | None = None
    last_rescale: datetime | None = None
    replaced: list[str] = field(default_factory=list)
    """KeepSurvivors: stale pods whose index the current generation gives to a new pod."""
    probes: tuple[ProbeView, ...] = ()
    create_probes: tuple[int, ...] = ()
    keep_probes: bool = False
    reason: str = ""
    message: str = ""
    events: list[Event] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    create: CreatePods | None = None
    requeue: list[float] = field(default_factory=list)
    delete_job: bool = False
    relabel: list[str] = field(default_factory=list)

    def transition(self, phase: Phase, reason: str, message: str, *, warning: bool = False) -> None:
        assert reason in cond.REASONS, f"reason {reason} is not in conditions.REASONS"
        if phase != self.phase or reason != self.reason:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))
        self.phase, self.reason, self.message = phase, reason, message

    def counters(self) -> Counters:
        return Counters(self.generation, self.restarts, self.disruptions)

    @property
    def ranked(self) -> tuple[int, ...]:
        """The current generation's pod indices in rank order."""
        return self.members if self.members is not None else tuple(range(self.replicas))

    def count(
        self, counters: Counters, replicas: int, members: tuple[int, ...] | None = None
    ) -> None:
        """Adopt the counters of a decision (``torchjob.plan.generation``) and the new size
        (pods ``members`` in rank order; default ``0..replicas-1``)."""
        self.generation, self.restarts, self.disruptions = (
            counters.generation,
            counters.restarts,
            counters.disruptions,
        )
        self.resize(replicas, members)

    def resize(self, replicas: int, members: tuple[int, ...] | None = None) -> None:
        assert members is None or len(members) == replicas, (members, replicas)
        self.replicas = replicas
        self.members = None if members is None or members == tuple(range(replicas)) else members

    def next_generation(self, replicas: int, members: tuple[int, ...] | None = None) -> None:
        """A resize: the next generation, charged to no counter."""
        self.count(self.counters().resized(), replicas, members)
