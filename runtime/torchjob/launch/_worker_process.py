"""What one worker process holds, in one object: its connection to the driver, its place in
the group, its ``worker_state``, its stop flag, the store it serves and the watchers of its
current generation (``torchjob.launch.worker`` keeps the current one; a process forked from a
zygote starts with a fresh one).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from torchjob.launch.errors import classify_failure
from torchjob.launch.layout import StoreLayout, prefixed
from torchjob.launch.protocol import (
    Exit,
    Init,
    InitFailed,
    ProtocolError,
    Ready,
    Reform,
    Run,
    TaskDone,
    TaskFailed,
    WorkerEvent,
)
from torchjob.launch.settings import RuntimeSettings, WorkerEnv


@dataclass(frozen=True)
class WorkerInfo:
    """Who this worker process is in its group."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    generation: int
    backend: str
    device: str


@dataclass
class WorkerProcess:
    """One worker process's state (a blank one outside a worker process)."""

    conn: Connection | None = None
    """The connection to the driver (None outside a worker process)."""
    env: WorkerEnv = field(default_factory=WorkerEnv)
    """What the driver set for this process (its place in the group), as of its last formation."""
    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    state: dict[str, Any] = field(default_factory=dict)
    """``worker_state()``: lives as long as the process."""
    info: WorkerInfo | None = None
    """``worker_info()``: set once the process is in a group."""
    task_id: int = 0
    """The task running now: events sent meanwhile carry it."""
    stop: threading.Event = field(default_factory=threading.Event)
    """Set by SIGTERM (or ``request_stop``)."""
    regroup: threading.Event = field(default_factory=threading.Event)
    """Set by ``REGROUP_SIGNAL``: the group ends at the next report to re-form, and the
    state is in the survivors' memory (``regroup_requested``)."""
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    served: dict[int, Any] = field(default_factory=dict)
    """The TCPStore this process serves, by port (rank 0 only). It outlives a re-formation, so
    a surviving rank 0 keeps serving the rendezvous on the same port: a new store could not
    bind it."""
    group_sockets: frozenset[int] = frozenset()
    """The connections the current group opened (gloo's pairs; on rank 0, also the store's
    that peers opened meanwhile, which are never shut down): what leaving a broken group
    closes."""
    init: Init | None = None
    """How the driver started this process (its first message): a re-formation forms as it says."""
    watchers: list[Any] = field(default_factory=list)
    """This generation's heartbeat and watchdog (``torchjob.launch.heartbeat``) and, for an
    NCCL group that re-forms in place, its abort listener (``torchjob.launch.nccl``)."""

    @classmethod
    def from_env(cls, conn: Connection | None = None) -> WorkerProcess:
        """A fresh process object for this process's environment (read once, here)."""
        return cls(conn=conn, env=WorkerEnv.from_env(), settings=RuntimeSettings.from_env())

    @property
    def layout(self) -> StoreLayout:
        """The current generation's store and keys."""
        return self.env.layout(self.settings)

    # --- talking to the driver ---------------------------------------------------------------
    def send(self, msg: object) -> None:
        assert self.conn is not None
        with self.send_lock:
            self.conn.send(msg)

    def send_event(self, payload: Any) -> bool:
        if self.conn is None or self.info is None:
            return False
        self.send(WorkerEvent(self.task_id, cloudpickle.dumps(payload)))
        return True

    def keep_fds(self) -> frozenset[int]:
        """The driver's connection: never broken with a group's."""
        return frozenset({self.conn.fileno()}) if self.conn is not None else frozenset()

    # --- forming a group ---------------------------------------------------------------------
    def form(self, init: Init) -> None:
        """Join this generation's process group (as the environment names it); set ``info``."""
        device = self._init_process_group(init)
        from torchjob.launch import dtensor_cache

        dtensor_cache.forget()  # specs cached in an earlier generation hold that one's coordinate
        e = self.env
        self.info = WorkerInfo(
            rank=e.rank,
            local_rank=e.local_rank,
            world_size=e.world_size,
            local_world_size=e.local_world_size,
            node_rank=e.node_rank,
            generation=e.generation,
            backend=init.backend,
            device=device,
        )
        self._watch_peers(self.info)
        from torchjob.launch import abort, nccl

        if self.info.backend == "nccl" and nccl.enabled(self.settings) and e.world_size > 1:
            self.watchers.append(abort.AbortListener(nccl.abort_group, self.layout).start())

    def reform(self, init: Init, env: dict[str, str]) -> None:
        """Leave the current process group (if any) and join the one ``env`` names, in this
        process: the interpreter, its imports, its CUDA context and its ``state`` stay."""
        import torch.distributed as dist

        from torchjob.launch import nccl

        self.stop_watching()
        if dist.is_initialized():
            if self._aborts_nccl():
                nccl.abort_group()  # the group may have lost a peer: no collective teardown
            else:
                dist.destroy_process_group()
        self.info = None
        os.environ.update(env)
        self.env = WorkerEnv.from_env()
        self.settings = RuntimeSettings.from_env()
        self.stop.clear()
        self.regroup.clear()
        self.form(init)

    def _aborts_nccl(self) -> bool:
        from torchjob.launch import nccl

        return self.info is not None and self.info.backend == "nccl" and nccl.enabled(self.settings)

    def _init_process_group(self, init: Init) -> str:
        import torch
        import torch.distributed as dist

        device = "cpu"
        e = self.env
        if init.use_gpu and torch.cuda.is_available():
            torch.cuda.set_device(e.local_rank)
            device = f"cuda:{e.local_rank}"
        timeout = timedelta(seconds=float(init.timeout_s))
        store = self._rendezvous_store(timeout)
        from torchjob.launch import heartbeat
        from torchjob.launch.heartbeat import socket_inodes

        if e.world_size > 1 and (after := self.settings.silent_peer_s) > 0:
            # The watchdog's connection, ahead of the group: connected by the whole group at
            # once after its formation, a few took seconds and were still trying when a loss
            # came soon after (64 ranks on the 2-core sandbox), delaying its re-formation.
            with contextlib.suppress(Exception):  # the watchdog tries again itself
                heartbeat.store_client(after, connect=timeout, layout=self.layout)

        # Arrived: a formation that waits can tell a member that never came from one that did
        # (``torchjob.train.recovery.formation``); it costs one small request.
        with contextlib.suppress(Exception):
            store.set(StoreLayout.arrival_key(e.rank), "1")
        before = socket_inodes()
        dist.init_process_group(
            backend=init.backend, store=store, rank=e.rank, world_size=e.world_size, timeout=timeout
        )
        self.group_sockets = socket_inodes() - before
        return device

    def _rendezvous_store(self, timeout: timedelta) -> Any:
        """This generation's store: the driver serves it for a local group
        (``TORCHJOB_LAUNCH_STORE_SERVED``), else rank 0 serves the TCPStore on ``MASTER_PORT``
        (kept across re-formations); the others connect to it and keep the connection across
        re-formations (``torchjob.launch.store_clients``). Keys live under the generation's
        prefix (and the driver's formation's, ``torchjob.launch.layout``), so a re-formed
        group never reads a previous one's keys, and a fresh process (a joiner) and a
        survivor meet in the same place."""
        from torchjob.launch import store_clients

        layout = self.layout
        addr, port = layout.addr, layout.port
        if self.env.rank == 0 and not layout.formation:
            store = self.served.get(port)
            if store is None:
                store = _serve_store(addr, port, timeout, layout.use_libuv)
                self.served[port] = store
        else:  # the connection of the generation before, where it still answers
            store = store_clients.client(
                "rendezvous",
                addr,
                port,
                connect=timeout,
                timeout=timeout,
                use_libuv=layout.use_libuv,
            )
        return prefixed(layout.rendezvous, store)

    # --- watching the peers ------------------------------------------------------------------
    def _watch_peers(self, info: WorkerInfo) -> None:
        """Start this generation's heartbeat and watchdog: a silent peer is reported to the
        driver within ``TORCHJOB_SILENT_PEER_S`` seconds (``torchjob.launch.heartbeat``)."""
        from torchjob.launch import heartbeat
        from torchjob.launch.protocol import SilentPeer, StoreQuiet

        after = self.settings.silent_peer_s
        if after <= 0 or info.world_size == 1:
            return
        first = info.rank - info.local_rank

        def on_silent(rank: int, silent_s: float) -> None:
            since = time.monotonic() - silent_s
            self.send_event(SilentPeer(rank=rank, silent_s=silent_s, by=info.rank, since=since))

        def on_quiet(quiet_s: float) -> None:
            self.send_event(StoreQuiet(silent_s=quiet_s, by=info.rank))

        dog = heartbeat.Watchdog(
            rank=info.rank,
            world_size=info.world_size,
            local_ranks=range(first, first + info.local_world_size),
            on_silent=on_silent,
            on_quiet=on_quiet,
            silent_after=after,
            break_group=self.break_group,
            layout=self.layout,
        )
        self.watchers.append(dog.start())

    def stop_watching(self) -> None:
        while self.watchers:
            self.watchers.pop().stop()

    # --- leaving a broken group --------------------------------------------------------------
    def leave_broken_group(self, exc: BaseException) -> None:
        """After a collective failed because of a peer (its connection closed, a timeout):
        leave the process group at once. Closing this rank's connections fails the
        collectives its other peers are blocked in (a ring waits on its neighbours, not on the
        lost rank), so every survivor learns of the loss within moments instead of at the
        collective timeout, and answers the driver: the group can then re-form in place."""
        if classify_failure(exc) == "user":
            return
        self.stop_watching()
        from torchjob.launch import nccl

        # Its connections are closed first, whatever holds the group: destroy_process_group()
        # does not close gloo's pairs while an object still refers to the group (DDP's
        # reducer, kept by the failed function's traceback or the user's globals), and a peer
        # two hops away in the ring would wait on this rank until the collective's timeout.
        self.break_group()
        try:
            import torch.distributed as dist

            if self._aborts_nccl():
                nccl.abort_group()  # destroying a communicator whose peer is gone may hang
            elif dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # a broken group may fail to say goodbye; it is left either way
            pass

    def park(self, exc: BaseException, resume: Callable[[Run], bool]) -> None:
        """Inside a task whose group broke under it (``exc``, a peer's loss): leave the group,
        tell the driver the task failed as any survivor does, then answer the driver's
        commands without returning from the task. A :class:`Reform` re-forms this process as
        between tasks; the next :class:`Run` is offered to ``resume``: True, and this returns
        into the task, which goes on in the new group (``torchjob.train.recovery.in_place``);
        False, and :class:`Abandon` carries the :class:`Run` out of the task, to be run
        afresh. :class:`Exit` (or the driver gone) raises :class:`Leave`."""
        assert self.conn is not None and self.init is not None
        self.leave_broken_group(exc)
        self.send(TaskFailed.of(self.task_id, exc))
        self._parked(resume)

    def park_done(self, data: bytes, resume: Callable[[Run], bool]) -> None:
        """Inside a task that ends here as a stop (``data``: its cloudpickled result), whose
        group re-forms in place: answer the task as done, then wait inside it as
        :meth:`park` does (the group is left at the driver's :class:`Reform`)."""
        assert self.conn is not None and self.init is not None
        self.send(TaskDone(self.task_id, data))
        self._parked(resume)

    def _parked(self, resume: Callable[[Run], bool]) -> None:
        assert self.conn is not None and self.init is not None
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                raise Leave() from None
            if isinstance(msg, Reform):
                try:
                    self.reform(self.init, msg.env)
                except BaseException as failed:
                    self.send(InitFailed.of(failed))
                    continue
                self.send(Ready())
            elif isinstance(msg, Run):
                self.task_id = msg.task_id
                if resume(msg):
                    return
                raise Abandon(msg)
            elif isinstance(msg, Exit):
                raise Leave()
            else:
                raise ProtocolError(f"a parked worker got {msg!r}"[:300])

    def break_group(self) -> None:
        """Shut down the current group's own connections: a collective blocked on them fails."""
        from torchjob.launch import heartbeat

        with contextlib.suppress(Exception):
            heartbeat.break_group_connections(self.group_sockets, self.keep_fds())


class Abandon(BaseException):  # not an error: control flow out of a task
    """A parked task gives way: the driver's next :class:`Run` is run afresh (not an
    ``Exception``, so a training function's ``except Exception`` does not keep it)."""

    def __init__(self, run: Run) -> None:
        super().__init__("the parked task gives way to the next one")
        self.run = run


class Leave(BaseException):
    """A parked task ends with its process: the driver said :class:`Exit`, or is gone."""


def _serve_store(addr: str, port: int, timeout: timedelta, use_libuv: bool) -> Any:
    """Rank 0's TCPStore server. The port may still be held for a moment by the process that
    served it before: rank 0 moves between pods that share an address only where pods share
    a network (several "pods" on one host); it is retried until ``timeout``, never longer."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        try:
            return dist.TCPStore(  # type: ignore[attr-defined]  # re-exported from torch._C
                addr, port, None, True, timeout, wait_for_workers=False, use_libuv=use_libuv
            )
        except RuntimeError as exc:  # DistNetworkError is a RuntimeError
            if "in use" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
