"""The planner's values: what it is given (``JobView``), what it answers (``Plan``), and
the immutable state of one decision while it is being made (``Decision``).

A ``Decision`` is never changed in place: every step of ``plan`` (and of ``loss``,
``ending``, ``elastic``, ``phase``) takes one and returns a new one. Who sets what:

==========================================  ==============================================
fields                                      set by
==========================================  ==============================================
``generation restarts disruptions``         ``count`` / ``next_generation`` only: the
``replicas members``                        decisions of ``torchjob.rules`` (a restart, a
                                            disruption, a resize); ``resize`` adopts a size
``phase reason message``                    ``transition`` only (and it adds the Event)
``created_generation restart_after``        the branch that starts or adopts a generation
``start_time completion_time``              (``plan``, ``loss``, ``ending``, ``elastic``)
``last_failure``                            ``loss`` (a worker failed)
``spec_replicas``                           ``plan`` (the user's scale)
``last_rescale keep_probes create_probes``  ``elastic`` (capacity-driven resizes)
``standby_ready replaced relabel``          ``plan`` (after the lifecycle, KeepSurvivors)
``placing_again``                           ``nodes.place_again``, ``plan`` (it creates them)
``create``                                  ``plan`` (a generation's pods), ``elastic``
                                            (joiners)
``initialize``                              ``initializing`` (the initialisers' pods)
``delete delete_job``                       ``plan``, ``ending``
``events requeue``                          every step adds (``also``), none removes
==========================================  ==============================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from torchjob.api.models import FailureRecord, Phase, TorchJobSpec
from torchjob.rules import Counters
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.events import Event
from torchjob_operator.common.nodes import NodeView
from torchjob_operator.torchjob import initializers
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
    """The job's Kueue Workload (torchjob/kueue.py); None: Kueue does not manage the job."""
    initializers: initializers.InitGate | None = None
    """``spec.initializers`` decided (torchjob/initializers.py); None: the job has none."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes no new pod goes to: noticed or not reporting (``common.nodes.avoided``)."""
    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    """What the Node watch knows of the nodes (empty without it): a pod's node's topology
    labels, to tell a worker that spilled out of the job's domains (``topology.spilled``)."""


@dataclass(frozen=True)
class CreatePods:
    indices: tuple[int, ...]
    generation: int
    replicas: int
    joiners: bool = False
    """Created ahead of ``generation`` (not yet published): an elastic job's replacements."""
    members: tuple[int, ...] | None = None
    """The rank order of ``generation`` when it is not ``0..replicas-1`` (``Decision.members``)."""
    avoid: tuple[str, ...] = ()
    """Nodes these pods must stay off, beyond the Node watch's (``Move.keep_off``)."""


@dataclass(frozen=True)
class Move:
    """Members moved off crowded nodes in one re-formation (``torchjob/spread.py``)."""

    leavers: tuple[int, ...]
    """The moving members' pod indices."""
    moves: tuple[tuple[int, str, str], ...]
    """(member, from, to) for each: ``to`` is a node with the fewest members that the job may
    use (the replacement goes by the scheduler, kept off ``keep_off``)."""
    keep_off: tuple[str, ...]
    """The nodes that hold members and are no move's target: the replacements stay off them."""
    counts: tuple[tuple[str, int], ...] = ()
    """Members per node before the move (the nodes that hold one, and the targets)."""


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
    initialize: tuple[str, ...] = ()
    """Initialiser pods to create (kinds: ``dataset``, ``model``)."""

    @property
    def phase(self) -> Phase:
        return Phase(self.status["phase"])


@dataclass(frozen=True)
class Decision:
    """One plan while it is being decided (see the module docstring for who sets what)."""

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
    leaving: tuple[int, ...] = ()
    """Members given notice that train on while their replacements start (``drain``)."""
    replace_later: tuple[tuple[int, datetime], ...] = ()
    """(index, when) of each leaver whose node's notice is longer than the job's replacement
    lead: its replacement is created then, ``drain.replacement_lead`` before it goes
    (``drain``); until then it counts as a member that stays."""
    donor: int | None = None
    """The leaver kept into the next generation to hand its state to the replacements of
    every other member (``drain._donor``): every member was given notice."""
    move: Move | None = None
    """A member this pass moves off a crowded node (``spread``)."""
    replaced: tuple[str, ...] = ()
    """KeepSurvivors: stale pods whose index the current generation gives to a new pod."""
    placing_again: tuple[int, ...] = ()
    """Members deleted before they were ever scheduled, kept off nodes no longer avoided:
    created again in this generation once gone (``nodes.place_again``)."""
    probes: tuple[ProbeView, ...] = ()
    create_probes: tuple[int, ...] = ()
    keep_probes: bool = False
    reason: str = ""
    message: str = ""
    waiting: str = ""
    """What this pass waits out (the backoff's countdown): said in the Restarting condition
    after the message, never carried into the next pass (which reads the Ready condition)."""
    events: tuple[Event, ...] = ()
    delete: tuple[str, ...] = ()
    create: CreatePods | None = None
    requeue: tuple[float, ...] = ()
    delete_job: bool = False
    relabel: tuple[str, ...] = ()
    initialize: tuple[str, ...] = ()

    def but(self, **changes: Any) -> Decision:
        """This decision with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)

    def also(
        self,
        *,
        events: Iterable[Event] = (),
        delete: Iterable[str] = (),
        requeue: Iterable[float] = (),
    ) -> Decision:
        """This decision with more Events, pods to delete and requeue candidates."""
        return replace(
            self,
            events=self.events + tuple(events),
            delete=self.delete + tuple(delete),
            requeue=self.requeue + tuple(requeue),
        )

    def transition(
        self, phase: Phase, reason: str, message: str, *, warning: bool = False
    ) -> Decision:
        """The phase and what the Ready condition says, with an Event when either changed."""
        assert reason in cond.REASONS, f"reason {reason} is not in conditions.REASONS"
        events = self.events
        if phase != self.phase or reason != self.reason:
            events += (Event("Warning" if warning else "Normal", reason, message),)
        return replace(self, phase=phase, reason=reason, message=message, events=events)

    def counters(self) -> Counters:
        return Counters(self.generation, self.restarts, self.disruptions)

    @property
    def checkpoints_in_generation(self) -> int:
        """Checkpoints the current generation committed, as far as the status says (0 or 1:
        rank 0 reports the generation of its latest one)."""
        progress = self.job.state.progress
        return int(progress is not None and progress.checkpoint_generation == self.generation)

    @property
    def ranked(self) -> tuple[int, ...]:
        """The current generation's pod indices in rank order."""
        return self.members if self.members is not None else tuple(range(self.replicas))

    def count(
        self, counters: Counters, replicas: int, members: tuple[int, ...] | None = None
    ) -> Decision:
        """Adopt the counters of a decision (``torchjob.rules.generation``) and the new size
        (pods ``members`` in rank order; default ``0..replicas-1``)."""
        return replace(
            self,
            generation=counters.generation,
            restarts=counters.restarts,
            disruptions=counters.disruptions,
            placing_again=(),
        ).resize(replicas, members)

    def resize(self, replicas: int, members: tuple[int, ...] | None = None) -> Decision:
        assert members is None or len(members) == replicas, (members, replicas)
        ranked = None if members is None or members == tuple(range(replicas)) else members
        return replace(self, replicas=replicas, members=ranked)

    def next_generation(self, replicas: int, members: tuple[int, ...] | None = None) -> Decision:
        """A resize: the next generation, charged to no counter."""
        return self.count(self.counters().resized(), replicas, members)
