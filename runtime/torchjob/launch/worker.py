"""The worker process: joins the process group, then runs functions the driver sends it.

Started by :class:`torchjob.launch.WorkerGroup` as ``python -m torchjob.launch._entry``
(a fresh interpreter, like torchrun's workers), so a user's script is never
re-imported in the workers and Ray's top-level ``trainer.fit()`` snippets work
without an ``if __name__ == "__main__"`` guard. Functions arrive cloudpickled,
so lambdas and closures from scripts and tests run too.

Per-process state survives between ``execute`` calls in :func:`worker_state`,
which is what a stateful trainer (RaySGD's ``PyTorchTrainer``) keeps its model in.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from torchjob.launch.errors import classify_failure

# Environment variables the driver gives each worker (besides the torchrun ones).
ENV_DRIVER_ADDR = "TORCHJOB_LAUNCH_DRIVER"
ENV_TOKEN = "TORCHJOB_LAUNCH_TOKEN"
ENV_DRIVER_PID = "TORCHJOB_LAUNCH_DRIVER_PID"
STACK_SIGNAL = signal.SIGUSR2
"""Makes a worker write every thread's Python stack to stderr (faulthandler): the driver
sends it to the ranks that do not answer after a failure (``execution._dump_stacks``)."""
ENV_STORE_SERVED = "TORCHJOB_LAUNCH_STORE_SERVED"
"""``N`` > 0: the driver serves the rendezvous store (a local group; this is its N-th
formation there, which keys the rendezvous apart), so rank 0 connects to it as the others
do; ``0`` or unset: rank 0 serves it (``WorkerGroup._with_store``)."""


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


_STATE: dict[str, Any] = {}
_INFO: WorkerInfo | None = None
_CONN: Connection | None = None
_SEND_LOCK = threading.Lock()
_TASK_ID: list[int] = [0]
_STOP = threading.Event()


def worker_state() -> dict[str, Any]:
    """A dict private to this worker process that lives as long as the process.

    ``execute`` calls on the same group see the same dict, so a trainer can keep
    its model, optimizer and data loaders here between calls.
    """
    return _STATE


def worker_info() -> WorkerInfo | None:
    """This process's place in the group; ``None`` outside a worker process."""
    return _INFO


def stop_requested() -> bool:
    """True once this worker received SIGTERM (or the driver asked it to stop).

    Only *this* rank knows; the trainer all-reduces the flag so all ranks stop at
    the same step.
    """
    return _STOP.is_set()


def request_stop() -> None:
    """Set this worker's stop flag (what the SIGTERM handler does)."""
    _STOP.set()


def clear_stop() -> None:
    _STOP.clear()


def send_event(payload: Any) -> bool:
    """Send ``payload`` to the driver while a function runs; False outside a worker.

    The driver receives it in :meth:`Execution.wait`'s ``on_event(rank, payload)``.
    """
    if _CONN is None or _INFO is None:
        return False
    data = cloudpickle.dumps(payload)
    with _SEND_LOCK:
        _CONN.send(("event", _TASK_ID[0], data))
    return True


def _watch_parent(driver_pid: int) -> None:
    """Exit when the driver is gone, so no orphan keeps a port or a GPU. The driver is the
    parent, or (a worker forked by the zygote) named by ``TORCHJOB_LAUNCH_DRIVER_PID``."""
    try:
        fd = os.pidfd_open(driver_pid)  # readable once the driver exits; no pid reuse
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        select.select([fd], [], [])
        os._exit(70)
    while True:
        if os.getppid() != driver_pid:
            try:
                os.kill(driver_pid, 0)
            except ProcessLookupError:
                os._exit(70)
        time.sleep(1.0)


def _send(conn: Connection, msg: tuple[Any, ...]) -> None:
    with _SEND_LOCK:
        conn.send(msg)


def _leave_broken_group(exc: BaseException) -> None:
    """After a collective failed because of a peer (its connection closed, a timeout): leave
    the process group at once. Closing this rank's connections fails the collectives its
    other peers are blocked in (a ring waits on its neighbours, not on the lost rank), so
    every survivor learns of the loss within moments instead of at the collective timeout,
    and answers the driver: the group can then re-form in place."""
    if classify_failure(exc) == "user":
        return
    _stop_watching()
    from torchjob.launch import nccl

    # Its connections are closed first, whatever holds the group: destroy_process_group() does
    # not close gloo's pairs while an object still refers to the group (DDP's reducer, kept
    # by the failed function's traceback or the user's globals), and a peer two hops away in
    # the ring would wait on this rank until the collective's timeout.
    _break_group()
    try:
        import torch.distributed as dist

        if _INFO is not None and _INFO.backend == "nccl" and nccl.enabled():
            nccl.abort_group()  # destroying a communicator whose peer is gone may hang
        elif dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group may fail to say goodbye; it is left either way
        pass


def _break_group() -> None:
    """Shut down the current group's own connections: a collective blocked on them fails."""
    from torchjob.launch import heartbeat

    with contextlib.suppress(Exception):
        keep = frozenset({_CONN.fileno()}) if _CONN is not None else frozenset()
        heartbeat.break_group_connections(_GROUP_SOCKETS[0], keep)


def _error_msg(kind: str, task_id: int, exc: BaseException) -> tuple[Any, ...]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (kind, task_id, type(exc).__qualname__, str(exc), tb, classify_failure(exc))


_SERVER: dict[int, Any] = {}
"""The TCPStore this process serves, by port (rank 0 only). It outlives a re-formation, so a
surviving rank 0 keeps serving the rendezvous on the same port: a new store could not bind it."""


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


def _rendezvous_store(timeout: timedelta) -> Any:
    """This generation's store: the driver serves it for a local group (``ENV_STORE_SERVED``),
    else rank 0 serves the TCPStore on ``MASTER_PORT`` (kept across re-formations); the
    others connect to it and keep the connection across re-formations
    (``torchjob.launch.store_clients``). Keys live under the generation's prefix (and the
    driver's formation's), so a re-formed group never reads a previous one's keys, and a
    fresh process (a joiner) and a survivor meet in the same place."""
    import torch.distributed as dist

    from torchjob.launch import store_clients

    addr = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    formation = os.environ.get(ENV_STORE_SERVED) or "0"
    if int(os.environ["RANK"]) == 0 and formation == "0":
        store = _SERVER.get(port)
        if store is None:
            store = _serve_store(addr, port, timeout, store_clients.use_libuv())
            _SERVER[port] = store
    else:  # the connection of the generation before, where it still answers
        store = store_clients.client("rendezvous", addr, port, connect=timeout, timeout=timeout)
    generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"torchjob/g{generation}" + (f"/f{formation}" if formation != "0" else "")
    return dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]


def _init_process_group(init: dict[str, Any]) -> str:
    import torch
    import torch.distributed as dist

    backend = init["backend"]
    device = "cpu"
    if init["use_gpu"] and torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    timeout = timedelta(seconds=float(init["timeout_s"]))
    store = _rendezvous_store(timeout)
    from torchjob.launch import heartbeat
    from torchjob.launch.heartbeat import socket_inodes

    if int(os.environ["WORLD_SIZE"]) > 1 and (after := heartbeat.silent_after_s()) > 0:
        # The watchdog's connection, ahead of the group: connected by the whole group at
        # once after its formation, a few took seconds and were still trying when a loss
        # came soon after (64 ranks on the 2-core sandbox), delaying its re-formation.
        with contextlib.suppress(Exception):  # the watchdog tries again itself
            heartbeat.store_client(after, connect=timeout)

    before = socket_inodes()
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
    _GROUP_SOCKETS[0] = socket_inodes() - before
    return device


_GROUP_SOCKETS: list[frozenset[int]] = [frozenset()]
"""The connections the current group opened (gloo's pairs; on rank 0, also the store's that
peers opened meanwhile, which are never shut down): what leaving a broken group closes."""


_WATCHERS: list[Any] = []
"""This generation's heartbeat and watchdog (``torchjob.launch.heartbeat``) and, for an NCCL
group that re-forms in place, its abort listener (``torchjob.launch.nccl``)."""


def _watch_peers(info: WorkerInfo) -> None:
    """Start this generation's heartbeat and watchdog: a silent peer is reported to the
    driver within ``TORCHJOB_SILENT_PEER_S`` seconds (``torchjob.launch.heartbeat``)."""
    from torchjob.launch import heartbeat

    after = heartbeat.silent_after_s()
    if after <= 0 or info.world_size == 1:
        return
    first = info.rank - info.local_rank

    def on_silent(rank: int, silent_s: float) -> None:
        send_event({"type": "silent_peer", "rank": rank, "silent_s": silent_s, "by": info.rank})

    dog = heartbeat.Watchdog(
        rank=info.rank,
        world_size=info.world_size,
        local_ranks=range(first, first + info.local_world_size),
        on_silent=on_silent,
        silent_after=after,
        break_group=_break_group,
    )
    _WATCHERS.append(dog.start())


def _stop_watching() -> None:
    while _WATCHERS:
        _WATCHERS.pop().stop()


def _form(init: dict[str, Any]) -> None:
    """Join this generation's process group (as the environment names it) and set ``_INFO``."""
    global _INFO
    device = _init_process_group(init)
    from torchjob.launch import dtensor_cache

    dtensor_cache.forget()  # specs cached in an earlier generation hold that one's coordinate
    _INFO = WorkerInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
        node_rank=int(os.environ.get("NODE_RANK", "0")),
        generation=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        backend=init["backend"],
        device=device,
    )
    _watch_peers(_INFO)
    from torchjob.launch import abort, nccl

    if _INFO.backend == "nccl" and nccl.enabled() and _INFO.world_size > 1:
        _WATCHERS.append(abort.AbortListener(nccl.abort_group).start())


def _reform(init: dict[str, Any], env: dict[str, str]) -> None:
    """Leave the current process group (if any) and join the one ``env`` names, in this
    process: the interpreter, its imports, its CUDA context and its ``worker_state`` stay."""
    import torch.distributed as dist

    from torchjob.launch import nccl

    global _INFO
    _stop_watching()
    if dist.is_initialized():
        if _INFO is not None and _INFO.backend == "nccl" and nccl.enabled():
            nccl.abort_group()  # the group may have lost a peer: no collective teardown
        else:
            dist.destroy_process_group()
    _INFO = None
    os.environ.update(env)
    _STOP.clear()
    _form(init)


def _warm_up() -> None:
    """A process waiting to be formed imports what the first step needs meanwhile:
    DDP's constructor imports the compiler stack (seconds of CPU), and so does
    ``torch.compiler.reset()``, the public way to load it (nothing is compiled yet)."""
    import torch.compiler
    import torch.distributed
    import torch.nn.parallel

    torch.compiler.reset()


def _connect() -> Connection:
    host, port = os.environ[ENV_DRIVER_ADDR].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.settimeout(None)
    return Connection(sock.detach())


def main() -> int:
    global _CONN
    signal.signal(signal.SIGTERM, lambda _s, _f: _STOP.set())
    # Every thread's stack to stderr on the driver's request (a rank that did not answer).
    faulthandler.register(STACK_SIGNAL, file=2, all_threads=True)  # fd 2: the job log
    conn = _connect()
    _CONN = conn
    conn.send(("hello", os.environ[ENV_TOKEN], int(os.environ["LOCAL_RANK"]), os.getpid()))
    driver = int(os.environ.get(ENV_DRIVER_PID) or os.getppid())
    threading.Thread(target=_watch_parent, args=(driver,), daemon=True).start()
    kind, init = conn.recv()
    assert kind == "init"
    sys.path[:] = list(init["sys_path"])
    try:
        if init.get("form", True):
            _form(init)
        else:
            _warm_up()
        if init["init_hook"] is not None:
            hook: Callable[[], None] = cloudpickle.loads(init["init_hook"])
            hook()
    except BaseException as exc:
        _send(conn, _error_msg("init_err", 0, exc))
        return 1
    _send(conn, ("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "exit":
            break
        if msg[0] == "reform":
            try:
                _reform(init, msg[1])
            except BaseException as exc:
                _send(conn, _error_msg("init_err", 0, exc))
                continue
            _send(conn, ("ready",))
            continue
        _, task_id, payload = msg
        _TASK_ID[0] = task_id
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            result = fn(*args, **kwargs)
            data = cloudpickle.dumps(result)
        except BaseException as exc:
            _leave_broken_group(exc)
            _send(conn, _error_msg("err", task_id, exc))
            continue
        _send(conn, ("ok", task_id, data))
    return 0
