"""One function running on a worker group, and how its failures reduce to one root cause.

:meth:`WorkerGroup.submit` sends a function to some of the group's workers and returns an
:class:`Execution`; :meth:`Execution.wait` collects the per-rank results (and the events
the workers send meanwhile), or raises the failure that explains the others, so the caller
does not have to read N stack traces.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, Protocol, TypeVar

import cloudpickle

from torchjob.launch import _start
from torchjob.launch.driver_beat import DriverBeat
from torchjob.launch.errors import (
    CollectiveTimeoutError,
    LaunchError,
    WorkerDiedError,
    WorkerGroupError,
)
from torchjob.launch.layout import StoreLayout
from torchjob.launch.placement import Placement
from torchjob.launch.protocol import Dispatcher, TaskDone, TaskFailed, WorkerEvent
from torchjob.launch.settings import RuntimeSettings

T = TypeVar("T")
EventHandler = Callable[[int, Any], None]
"""``on_event(rank, payload)``: a payload a worker sent with :func:`send_event`."""


class Group(Protocol):
    """What an execution needs of its :class:`~torchjob.launch.WorkerGroup`."""

    @property
    def placement(self) -> Placement: ...

    @property
    def formed(self) -> bool: ...

    @property
    def settings(self) -> RuntimeSettings: ...

    def store_layout(self) -> StoreLayout: ...

    def mark_broken(self, *, peer_loss_only: bool, survivors: bool = False) -> None: ...

    def peer_lost(self) -> None: ...


@dataclass
class WorkerHandle:
    """The driver's end of one worker: its process and its connection (None once lost)."""

    local_rank: int
    rank: int
    proc: _start.ProcessHandle
    conn: Connection | None = None

    def exitcode(self, wait_s: float = 5.0) -> int | None:
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None


@dataclass
class _Failure:
    rank: int
    kind: str  # "user", "peer", "timeout" or "died"
    at: float
    error: LaunchError


class Execution(Generic[T]):
    """A function running on some of the group's workers; :meth:`wait` collects it."""

    def __init__(self, group: Group, task_id: int, workers: list[WorkerHandle]) -> None:
        self._group = group
        self._task_id = task_id
        self._workers = workers

    def wait(
        self,
        *,
        on_event: EventHandler | None = None,
        on_tick: Callable[[], None] | None = None,
        tick_s: float = 0.5,
        grace_s: float = 3.0,
        loss_grace_s: float | Callable[[], float] = 30.0,
    ) -> list[T]:
        """Results in rank order, or raise the root cause of the failure.

        After the first failure the others get ``grace_s`` to report theirs, so that
        a worker death is preferred over the broken-connection errors it causes in
        its peers, and a collective timeout can name the rank that never joined.
        ``on_tick`` runs about every ``tick_s`` seconds (the trainer polls signals
        and scaling decisions there).

        While every failure is a death or a peer's broken connection, the others get up to
        ``loss_grace_s``: each survivor leaves its broken group on such an error
        (``worker._leave_broken_group``), which fails its neighbours' collectives in turn, so
        they all answer within moments and the survivors can re-form in place. A callable is
        asked at each look (the trainer waits that long only while a restore point is held).

        Meanwhile this process beats for its workers (``torchjob.launch.driver_beat``).
        """
        beat = DriverBeat.for_group(self._group, self._workers)
        try:
            return self._wait(on_event, on_tick, tick_s, grace_s, loss_grace_s)
        finally:
            if beat is not None:
                beat.stop()

    def _wait(
        self,
        on_event: EventHandler | None,
        on_tick: Callable[[], None] | None,
        tick_s: float,
        grace_s: float,
        loss_grace_s: float | Callable[[], float],
    ) -> list[T]:
        pending = {w.conn: w for w in self._workers if w.conn is not None}
        results: dict[int, T] = {}
        failures: list[_Failure] = []
        first_failure: float | None = None
        while pending:
            if first_failure is not None:
                losses_only = all(f.kind in ("died", "peer") for f in failures)
                loss_grace = loss_grace_s() if callable(loss_grace_s) else loss_grace_s
                if time.monotonic() - first_failure > (loss_grace if losses_only else grace_s):
                    break
            for conn in wait(list(pending), timeout=tick_s):
                assert isinstance(conn, Connection)
                worker = pending[conn]
                failure = self._receive(worker, conn, results, on_event)
                if failure is None and worker.local_rank not in results:
                    continue
                del pending[conn]
                if failure is not None:
                    if failure.kind == "died" and not any(f.kind == "died" for f in failures):
                        self._group.peer_lost()  # NCCL: the survivors abort their collective
                    failures.append(failure)
                    first_failure = first_failure or failure.at
            if on_tick is not None:
                on_tick()
        if failures and pending:
            _dump_stacks(list(pending.values()), failures)
        if failures:
            # Peers may be stuck in a collective unless every rank returned a plain exception.
            if pending or any(f.kind != "user" for f in failures):
                # Every local rank answered, each with a broken connection to another host:
                # the processes themselves are sound (see ``WorkerGroup.can_reform``).
                self._group.mark_broken(
                    peer_loss_only=not pending and all(f.kind == "peer" for f in failures),
                    # Dead ranks and survivors that each saw only a broken connection: the
                    # survivors' processes are sound (``WorkerGroup.heal``).
                    survivors=not pending and all(f.kind in ("died", "peer") for f in failures),
                )
            raise _root_cause(failures, hung=[w.rank for w in pending.values()])
        return [results[w.local_rank] for w in self._workers]

    def _receive(
        self,
        worker: WorkerHandle,
        conn: Connection,
        results: dict[int, T],
        on_event: EventHandler | None,
    ) -> _Failure | None:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            worker.conn = None
            died = WorkerDiedError(worker.rank, worker.exitcode())
            return _Failure(worker.rank, "died", time.monotonic(), died)
        return _ANSWER(msg, self._task_id, worker, results, on_event)


def _done(
    msg: TaskDone, task_id: int, w: WorkerHandle, results: dict[int, Any], _on: Any
) -> _Failure | None:
    if msg.task_id == task_id:  # else left over from an earlier, abandoned task
        results[w.local_rank] = cloudpickle.loads(msg.data)
    return None


def _event(
    msg: WorkerEvent, task_id: int, w: WorkerHandle, _results: Any, on_event: EventHandler | None
) -> _Failure | None:
    if msg.task_id == task_id and on_event is not None:
        on_event(w.rank, cloudpickle.loads(msg.data))
    return None


def _failed(
    msg: TaskFailed, task_id: int, w: WorkerHandle, _results: Any, _on: Any
) -> _Failure | None:
    if msg.task_id != task_id:
        return None
    err = WorkerGroupError(w.rank, msg.exc_type, msg.message, msg.traceback)
    return _Failure(w.rank, msg.kind, time.monotonic(), err)


_ANSWER = Dispatcher[_Failure | None]({TaskDone: _done, WorkerEvent: _event, TaskFailed: _failed})
"""A worker's message while a task runs: its result, an event, or its failure."""


def _dump_stacks(hung: list[WorkerHandle], failures: list[_Failure]) -> None:
    """Ask the ranks that did not answer after a failure for every thread's Python stack
    (``worker.STACK_SIGNAL``, faulthandler: written to their stderr, the job's log), so that
    what held them is on record before they are killed."""
    ranks = sorted(w.rank for w in hung)
    first = min(failures, key=lambda f: f.at)
    print(
        f"[torchjob] rank(s) {', '.join(map(str, ranks))} did not answer "
        f"{time.monotonic() - first.at:.0f}s after rank {first.rank} failed; their stacks follow",
        file=sys.stderr,
        flush=True,
    )
    write_stacks([w.proc for w in hung], land_s=0.5)


def write_stacks(procs: Sequence[_start.ProcessHandle], land_s: float) -> None:
    """Make every live one of ``procs`` (workers) write every thread's Python stack to its
    stderr (``worker.STACK_SIGNAL``: faulthandler writes from its C handler, also while a
    thread waits inside a C call such as a gloo collective), and give the writes ``land_s``."""
    from torchjob.launch.worker import STACK_SIGNAL

    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, STACK_SIGNAL)
    time.sleep(land_s)


def _root_cause(failures: list[_Failure], *, hung: list[int]) -> LaunchError:
    """The failure that explains the others.

    A worker's own exception or death comes first (earliest wins); peers'
    broken-connection errors are consequences. Timeouts without such a cause
    mean some rank never joined the collective: the ranks still running.
    """
    primary = [f for f in failures if f.kind in ("user", "died")]
    timeouts = [f for f in failures if f.kind == "timeout"]
    if not primary and timeouts:
        reporters = {f.rank for f in timeouts}
        suspects = sorted(hung) or sorted({f.rank for f in failures} - reporters)
        if suspects:
            first = timeouts[0].error
            detail = first.message if isinstance(first, WorkerGroupError) else str(first)
            return CollectiveTimeoutError(
                suspects[0], hung_ranks=suspects, detail=detail.splitlines()[0][:200]
            )
    root = min(primary or failures, key=lambda f: f.at)
    if isinstance(root.error, WorkerGroupError):
        others = {f.rank: str(f.error) for f in failures if f is not root}
        return WorkerGroupError(
            root.error.rank,
            root.error.exc_type,
            root.error.message,
            root.error.traceback_text,
            other_failures=others,
            # A collective that broke or timed out with no rank of this group to blame waited
            # for a rank elsewhere (another pod's, lost or silent): never the root cause.
            peer_failure=root.kind in ("peer", "timeout"),
        )
    return root.error
