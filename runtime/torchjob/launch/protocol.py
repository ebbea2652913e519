"""The launch layer's messages: frozen dataclasses, and the one :class:`Dispatcher` that
every receiving end uses.

Three conversations, each over a connection that pickles what it carries:

* **driver -> worker** (the worker's socket, ``torchjob.launch.worker``): :class:`Init`
  once, then :class:`Run`, :class:`Reform` and :class:`Exit`;
* **worker -> driver**: :class:`Hello` (the handshake, ``startup.accept_workers``), then
  :class:`Ready` or :class:`InitFailed` after each formation (``startup.await_ready``),
  and per task :class:`WorkerEvent`, :class:`TaskDone` or :class:`TaskFailed`
  (``execution.Execution``);
* **driver <-> zygote** (``torchjob.launch.zygote``): :class:`ForkRequest`, answered by
  :class:`ZygoteReady`, :class:`Forked`, :class:`Refused` and :class:`ChildExited`.

A :class:`WorkerEvent` carries a payload sent with ``send_event`` (cloudpickled, so that a
user's payload of any type travels too); torchjob's own payloads are the event classes
below (:class:`SilentPeer`, :class:`Report`, :class:`CheckpointLanded`, the restore-point
events...), which the driver's handlers (``train/controller.py``, ``train/recovery/survivors.py``,
``train/tracking.py``, ``tune/trainables.py``) dispatch by class too.

The classes are plain frozen, slotted dataclasses of builtins: they pickle by reference to
this module (importable in every process) and cost a few bytes over the tuples they
replace. Nothing else in the launch layer builds or matches message tags.
"""

from __future__ import annotations

import dataclasses
import operator
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from torchjob.launch.errors import LaunchError, classify_failure

R = TypeVar("R")

T = TypeVar("T")


def _by_fields(cls: type[T]) -> type[T]:
    """Pickle a message as its class and its fields' values (a constructor call): a
    dataclass's own pickling (its state, then ``__setstate__``) costs about eight times a
    tuple's; this costs about the tuple's. Every message crosses a pipe, many per step."""
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    if len(names) > 1:
        values: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
    elif names:
        one = operator.attrgetter(names[0])
        values = lambda msg: (one(msg),)  # noqa: E731
    else:
        values = lambda _msg: ()  # noqa: E731

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        return type(self), values(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls


class ProtocolError(LaunchError):
    """A message no handler expects (a bug, or a peer of another torchjob version)."""


class Dispatcher(Generic[R]):
    """Calls the handler registered for a message's class (exactly that class), with the
    message and the context the caller passes: ``dispatch(msg, *context)`` is
    ``handler(msg, *context)``.

    ``otherwise`` handles a message of any other class (a user's event payload, a reply
    left over from an abandoned task); without it such a message raises
    :class:`ProtocolError`. A table is built once (a module constant or an object's field)
    and is a dict lookup per message."""

    __slots__ = ("_handlers", "_otherwise")

    def __init__(
        self,
        handlers: Mapping[type[Any], Callable[..., R]],
        *,
        otherwise: Callable[..., R] | None = None,
    ) -> None:
        self._handlers = dict(handlers)
        self._otherwise = otherwise

    def __call__(self, message: object, *context: Any) -> R:
        handler = self._handlers.get(type(message))
        if handler is not None:
            return handler(message, *context)
        if self._otherwise is not None:
            return self._otherwise(message, *context)
        raise ProtocolError(f"unexpected message {type(message).__name__}: {message!r}"[:300])

    def handles(self, cls: type[Any]) -> bool:
        return cls in self._handlers


def ignore(_message: object, *_context: Any) -> None:
    """An ``otherwise`` that drops what it is given."""


# --- driver -> worker -------------------------------------------------------------------------
@_by_fields
@dataclass(frozen=True, slots=True)
class Init:
    """The first message to a worker: how to form (``form``: now, else at a :class:`Reform`)."""

    sys_path: tuple[str, ...]
    backend: str
    use_gpu: bool
    timeout_s: float
    init_hook: bytes | None
    """A cloudpickled ``() -> None`` run once after the start, or None."""
    form: bool = True


@_by_fields
@dataclass(frozen=True, slots=True)
class Reform:
    """Leave the current process group and join the one ``env`` names, in this process."""

    env: dict[str, str]


@_by_fields
@dataclass(frozen=True, slots=True)
class Run:
    """Run a cloudpickled ``(fn, args, kwargs)``; the answer carries ``task_id``."""

    task_id: int
    payload: bytes


@_by_fields
@dataclass(frozen=True, slots=True)
class Exit:
    """Leave the worker loop (the process exits)."""


# --- worker -> driver -------------------------------------------------------------------------
@_by_fields
@dataclass(frozen=True, slots=True)
class Hello:
    """A worker's first words on its new connection: the group's token and its local rank."""

    token: str
    local_rank: int
    pid: int


@_by_fields
@dataclass(frozen=True, slots=True)
class Ready:
    """The worker formed (or, unformed, warmed up) and ran the init hook."""


@_by_fields
@dataclass(frozen=True, slots=True)
class InitFailed:
    """Forming, or the init hook, raised."""

    exc_type: str
    message: str
    traceback: str
    kind: str
    """``classify_failure``'s word: ``user``, ``peer`` or ``timeout``."""

    @classmethod
    def of(cls, exc: BaseException) -> InitFailed:
        return cls(*_describe(exc))


@_by_fields
@dataclass(frozen=True, slots=True)
class TaskDone:
    task_id: int
    data: bytes
    """The cloudpickled result."""


@_by_fields
@dataclass(frozen=True, slots=True)
class TaskFailed:
    task_id: int
    exc_type: str
    message: str
    traceback: str
    kind: str
    """``classify_failure``'s word: ``user``, ``peer`` or ``timeout``."""

    @classmethod
    def of(cls, task_id: int, exc: BaseException) -> TaskFailed:
        return cls(task_id, *_describe(exc))


@_by_fields
@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """A payload sent with ``send_event`` while task ``task_id`` runs (cloudpickled)."""

    task_id: int
    data: bytes


def _describe(exc: BaseException) -> tuple[str, str, str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return type(exc).__qualname__, str(exc), tb, classify_failure(exc)


# --- event payloads (worker -> driver, inside a WorkerEvent) ----------------------------------
@_by_fields
@dataclass(frozen=True, slots=True)
class SilentPeer:
    """Rank ``by``'s watchdog found ``rank`` silent for ``silent_s`` (``heartbeat``), since
    ``since`` on the pod's monotonic clock (one kernel: the driver's clock too), so that the
    driver judges the silence as of when it reads the event, however late."""

    rank: int
    silent_s: float
    by: int
    since: float


@_by_fields
@dataclass(frozen=True, slots=True)
class StoreQuiet:
    """Rank ``by``'s watchdog has heard nothing from the generation's store (rank 0 serves
    it) for ``silent_s``: ``heartbeat.SWEEP_LEAD_S`` short of finding rank 0 silent. The
    driver sweeps the members' hosts now, so that the sweep is done when the report is due."""

    silent_s: float
    by: int


@_by_fields
@dataclass(frozen=True, slots=True)
class Report:
    """Rank 0 reported (``torchjob.train.report``)."""

    metrics: dict[str, Any]
    checkpoint_path: str | None
    checkpoint_index: int | None
    checkpoint_pending: bool
    """A checkpoint is being committed in the background (a :class:`CheckpointLanded` follows)."""
    world_size: int
    generation: int
    report: int
    """The run's report number: the reports before this generation's state (the restore point's,
    or the driver's record when it started from storage) plus this generation's. Rank 0's
    driver may not have seen the earlier ones: rank 0 moves between pods (status.members)."""
    restore_point: bool
    """The workers hold this report's state in memory (a restore point or the shard mirror)."""
    restore_point_bytes: int


@_by_fields
@dataclass(frozen=True, slots=True)
class CheckpointLanded:
    """A background commit of rank 0 landed."""

    path: str
    index: int | None
    generation: int


@_by_fields
@dataclass(frozen=True, slots=True)
class RestoredFromMemory:
    """The generation started from the survivors' restore point, not from storage."""

    index: int
    source_rank: int
    seconds: float
    bytes: int
    in_place: bool = False
    """The survivors went on inside the training function (``recovery.in_place``): it was
    not run again."""
    kept_at: int | None = None
    """In place, the survivors kept their live state, at this report (a whole step, or the
    step the loss broke undone: ``recovery.step_undo``): the restore point was not loaded."""


@_by_fields
@dataclass(frozen=True, slots=True)
class RestoredFromMirror:
    """The generation rebuilt its sharded state from the shard mirror (``shard_rebuild``)."""

    index: int
    old_world: int
    world: int
    from_mirror: tuple[int, ...]
    bytes_moved: int
    seconds: float


@_by_fields
@dataclass(frozen=True, slots=True)
class MirrorFallback:
    """The shard mirror cannot rebuild the newest report: the generation reads storage."""

    reason: str


@_by_fields
@dataclass(frozen=True, slots=True)
class TrialReported:
    """A tuning trial's rank 0 reported (``torchjob.tune.session``)."""

    metrics: dict[str, Any]


@_by_fields
@dataclass(frozen=True, slots=True)
class TrialCheckpointed:
    """A tuning trial's latest checkpoint."""

    path: str


# --- driver <-> zygote ------------------------------------------------------------------------
@_by_fields
@dataclass(frozen=True, slots=True)
class ForkRequest:
    """Fork a worker with ``env`` in ``cwd``; the request's file descriptors become ``which``."""

    req: int
    env: dict[str, str]
    cwd: str
    which: tuple[int, ...]


@_by_fields
@dataclass(frozen=True, slots=True)
class ZygoteReady:
    pid: int
    cuda_touched: str | None
    """Why the zygote may not fork (it touched CUDA), or None."""


@_by_fields
@dataclass(frozen=True, slots=True)
class Forked:
    req: int
    pid: int


@_by_fields
@dataclass(frozen=True, slots=True)
class Refused:
    req: int
    why: str


@_by_fields
@dataclass(frozen=True, slots=True)
class ChildExited:
    pid: int
    code: int
    """The exit status, ``-N`` for a signal."""
