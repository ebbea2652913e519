"""Worker-side state of one training run: rank info, storage, checkpoint to resume, loaders.

One ``_Session`` exists per worker process while ``train_func`` runs; the public
functions (``report``, ``get_checkpoint``, ``get_context``, ``prepare_*``) read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torchjob.checkpoint import DataPosition
from torchjob.train.recovery.cadence import Cadence

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from torchjob.checkpoint.background import BackgroundCommitter
    from torchjob.train._sharded import ShardedSaver
    from torchjob.train.checkpoint import Checkpoint
    from torchjob.train.recovery.preemption import PreemptionInfo
    from torchjob.train.recovery.restore_point import Restored
    from torchjob.train.recovery.shard_rebuild import Plan


class PositionedLoader(Protocol):
    """What the session needs of a prepared DataLoader (``_prepare.PreparedDataLoader``,
    which imports this module): where it is in its data."""

    def position(self) -> DataPosition: ...

    def reshard(self, world_size: int, rank: int) -> None: ...


class StopTraining(BaseException):
    """Raised by ``report`` on every rank once the group agreed to stop (not an ``Exception``,
    so a user's ``except Exception`` does not swallow it)."""


@dataclass
class Session:
    world_rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    generation: int
    experiment_name: str
    run_path: str
    device: str
    storage_url: str | None
    num_to_keep: int | None
    score_attribute: str | None
    score_order: str
    checkpoint: Checkpoint | None = None
    resume_positions: list[DataPosition] = field(default_factory=list)
    loaders: list[PositionedLoader] = field(default_factory=list)
    reports: int = 0
    stopped_at_report: int | None = None
    stop_polled: bool | None = None
    """What ``should_stop()`` agreed since the last report (None: not asked). The next
    ``report()`` stops on that answer, not on a newer one: a loop that checkpoints when
    ``should_stop()`` says so never stops at a report that carries no checkpoint."""
    regroup_polled: bool = False
    """``should_stop()`` agreed to re-form from memory (``_report._agree``): the next
    ``report()`` ends the generation, though ``should_stop()`` said False to the loop."""
    whole_state: bool | None = None
    """The registered state is whole, not sharded (None: not looked at yet)."""
    last_metrics: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every report of this worker in this generation (rank 0's become the Result's)."""
    async_commit: bool = False
    committer: BackgroundCommitter | None = None
    """Rank 0 with ``async_commit``: the background commits of this generation's reports."""
    registered: MutableMapping[str, Any] | None = None
    """The state ``register_state`` handed over: copied into host memory at every report."""
    cadence: Cadence = field(default_factory=Cadence)
    """How often ``report()`` copies the registered state (``recovery.cadence``)."""
    restore_point_overlap: bool = True
    """The optimizers' part of each copy runs beside the next step (``recovery.host_copy``)."""
    restored: Restored | None = None
    """The in-memory restore point this generation started from (None: storage or fresh)."""
    unsynced: list[Any] = field(default_factory=list)
    """DDP models built without their init broadcast, the restore point to load into them
    (``_prepare.prepare_model``): ``register_state`` makes them equal on every rank."""
    report_base: int = 0
    """Reports of the run before this generation's (a restore point's index counts from it)."""
    async_save: bool = False
    """``CheckpointConfig.async_commit`` on every rank: sharded saves finish in the background."""
    sharded: ShardedSaver | None = None
    """Every rank, from its first ``Checkpoint.from_state`` report: its sharded saves."""
    state: Any = None
    """The ``TrainState`` last reported with ``Checkpoint.from_state`` (``None`` before)."""
    mirror_plan: Plan | None = None
    """Sharded state this generation rebuilds from the shard mirror (``register_state``)."""
    mirror_on: bool = True
    """``register_state(mirror=...)`` / ``TORCHJOB_SHARD_MIRROR``: sharded state is mirrored."""
    mirror_group: Any = None
    """A gloo group for the mirror where the default group is not gloo (NCCL)."""
    notice: PreemptionInfo | None = None
    """The notice every rank agreed on at the last ``report()`` or ``should_stop()``."""
    notice_digest: int | None = None
    """The sum of the ranks' notice digests then (None: no such point yet this generation)."""
    noticed: frozenset[int] = frozenset()
    """Every rank any agreed notice named in this generation, never fewer: the operator
    drops a leaver whose time ran out from ``status.leavingWorkers`` as it publishes the
    generation without it, so the notice shrinks while that rank still leaves."""
    in_place: bool = False
    """``register_state(in_place=True)`` took: a peer's loss parks the loop in
    ``should_stop()`` or ``report()`` and the group re-forms under it (``recovery.in_place``)."""
    void_report: bool = False
    """The loop re-formed in place in ``should_stop()`` and its state was rolled back: the
    next ``report()`` belongs to the step rolled back, and counts for nothing."""
    parked_note: Any = None
    """Where this rank's function parked in place (``recovery.in_place.Parked``), the note it
    brings to the next generation's agreement."""
    wrapped: list[Any] = field(default_factory=list)
    """The DDP models ``prepare_model`` built in this training function (``_ddp.wrap``)."""
    park_stopped: Callable[[Session], None] | None = None
    """Ends the task as a stop at this report, its function parked in it
    (``_worker_loop.park_stopped``); returns inside the next generation."""
    resume: Callable[[Any], bool] | None = None
    """What a parked training function is offered the driver's next task with
    (``_worker_loop.resume``: True, and it goes on in place)."""
    rolled_back: bool = True
    """The last in-place re-formation rolled the state back (else its live state was kept:
    every rank parked after the same whole step)."""

    def drain(self) -> None:
        """Wait for the background saves in flight (re-raising their errors)."""
        if self.sharded is not None:
            self.sharded.wait()
        if self.committer is not None:
            self.committer.wait()

    def data_positions(self) -> list[dict[str, Any]]:
        return [loader.position().to_dict() for loader in self.loaders]

    def resume_position_for(self, index: int) -> DataPosition | None:
        return self.resume_positions[index] if index < len(self.resume_positions) else None


def moved_to(s: Session, info: Any, restored: Restored, spec: Any, *, kept_at: int | None) -> None:
    """``s`` goes on in the next generation (re-formed in place, ``recovery.in_place``):
    its ranks, its numbering from the restore point it rolled back to (or from ``kept_at``,
    where its live state was kept), nothing polled."""
    s.world_rank, s.local_rank = info.rank, info.local_rank
    s.world_size, s.local_world_size = info.world_size, info.local_world_size
    s.node_rank, s.generation = info.node_rank, info.generation
    s.rolled_back = kept_at is None
    s.restored, s.reports = restored, 0
    s.report_base = restored.snapshot.index if kept_at is None else kept_at
    s.history, s.last_metrics, s.stopped_at_report = [], None, None
    s.stop_polled, s.regroup_polled = None, False
    s.notice, s.notice_digest, s.noticed = None, None, frozenset()
    s.checkpoint = None
    s.resume_positions = [DataPosition.from_dict(p) for p in restored.snapshot.positions or []]
    for loader in s.loaders:  # the next epoch is sharded for the new group
        loader.reshard(info.world_size, info.rank)
    s.async_commit = bool(spec.async_commit) and info.rank == 0
    s.committer = None


_CURRENT: list[Session | None] = [None]


def current() -> Session | None:
    return _CURRENT[0]


def set_current(session: Session | None) -> None:
    _CURRENT[0] = session


_FIT_LED: list[bool | None] = [None]
"""Whether this process's last ``fit()`` ran rank 0 in its last generation (None: no fit yet)."""


def fit_led() -> bool | None:
    return _FIT_LED[0]


def set_fit_led(led: bool) -> None:
    _FIT_LED[0] = led
