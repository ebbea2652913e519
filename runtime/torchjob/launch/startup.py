"""Starting a worker group's processes: the backend, the GPU check, each rank's torchrun
environment, and the handshake.

The handshake: every worker connects back to the driver's socket and says hello with the
group's token (:func:`accept_workers`), is sent its ``init`` message, and answers once it
joined the process group (:func:`await_ready`); a worker that exits or fails on the way
is reported as a :class:`WorkerGroupStartError` naming its rank.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path

from torchjob import contract
from torchjob.launch.errors import WorkerDiedError, WorkerGroupStartError
from torchjob.launch.execution import WorkerHandle
from torchjob.launch.placement import Placement
from torchjob.launch.protocol import Dispatcher, Hello, InitFailed, Ready
from torchjob.launch.settings import (
    ENV_DRIVER_ADDR,
    ENV_DRIVER_PID,
    ENV_TOKEN,
    RuntimeSettings,
)


def resolve_backend(backend: str, use_gpu: bool) -> str:
    """``auto`` -> ``nccl`` when GPUs are used and present, else ``gloo``."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    if backend != "auto":
        return backend
    if not use_gpu:
        return "gloo"
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def check_gpu_count(num_workers: int, use_gpu: bool) -> None:
    """One GPU per local worker: more workers than visible GPUs cannot start (as in Ray)."""
    if not use_gpu:
        return
    import torch

    if not torch.cuda.is_available():
        return  # CPU fallback, as documented
    visible = torch.cuda.device_count()
    if num_workers > visible:
        raise ValueError(
            f"use_gpu=True runs one worker per GPU: {num_workers} workers on this host, "
            f"but {visible} GPU(s) visible; use num_workers <= {visible} or use_gpu=False"
        )


def rank_env(
    placement: Placement, env: dict[str, str], local_rank: int, *, with_base: bool = True
) -> dict[str, str]:
    """The torchrun variables of one local rank under ``placement`` (over ``env``, and over
    this process's environment ``with_base``)."""
    p = placement
    return {
        **(dict(os.environ) if with_base else {}),
        **env,
        contract.RANK: str(p.rank_offset + local_rank),
        contract.LOCAL_RANK: str(local_rank),
        contract.WORLD_SIZE: str(p.world_size),
        contract.LOCAL_WORLD_SIZE: str(p.local_world_size),
        contract.GROUP_RANK: str(p.node_rank),
        contract.NODE_RANK: str(p.node_rank),
        contract.MASTER_ADDR: p.master_addr,
        contract.MASTER_PORT: str(p.master_port),
        contract.TORCHELASTIC_RESTART_COUNT: str(p.generation),
        contract.TORCHELASTIC_RUN_ID: p.run_id,
    }


def spawn_env(
    rank_vars: dict[str, str],
    *,
    driver: str,
    token: str,
    use_gpu: bool,
    backend: str,
    local_world_size: int,
    group_env: dict[str, str],
    settings: RuntimeSettings,
) -> dict[str, str]:
    """A new worker process's whole environment: its rank's (:func:`rank_env`), how to reach
    the driver, and the defaults below unless ``group_env`` (the group's own) sets them."""
    from torchjob.launch import nccl

    package_root = str(Path(__file__).resolve().parents[2])
    env = {
        **rank_vars,
        contract.PYTHONUNBUFFERED: "1",
        ENV_DRIVER_ADDR: driver,
        ENV_TOKEN: token,
        ENV_DRIVER_PID: str(os.getpid()),
        "PYTHONPATH": os.pathsep.join(
            [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    # Like Ray, workers without GPUs see none, so code that picks "cuda" whenever it is
    # available (seed snippets do) stays on the CPU its model is on.
    if not use_gpu and backend != "nccl" and "CUDA_VISIBLE_DEVICES" not in group_env:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if backend == "nccl" and nccl.enabled(settings):
        env = {**nccl.worker_env(settings), **env}  # a communicator error must not end a survivor
    # torchrun's default: one intra-op thread per process when several share a host.
    if "OMP_NUM_THREADS" not in env and local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def accept_workers(
    server: socket.socket, workers: Sequence[WorkerHandle], token: str, *, timeout_s: float
) -> None:
    """Wait until every worker without a connection connected back with ``token``; each
    gets its connection (``workers`` is indexed by local rank)."""
    deadline = time.monotonic() + timeout_s
    server.settimeout(0.5)
    joined = 0
    missing = sum(1 for w in workers if w.conn is None)
    while joined < missing:
        if time.monotonic() > deadline:
            raise WorkerGroupStartError(
                f"{missing - joined} worker(s) did not connect within {timeout_s:.0f}s"
            )
        for w in workers:
            code = w.proc.poll()
            if code is not None and w.conn is None:
                raise WorkerGroupStartError(
                    f"rank {w.rank} worker exited during start-up: {WorkerDiedError(w.rank, code).args[0]}"
                )
        try:
            sock, _ = server.accept()
        except TimeoutError:
            continue
        sock.settimeout(None)
        conn = Connection(sock.detach())
        hello = conn.recv()
        if not (isinstance(hello, Hello) and hello.token == token) or (
            workers[hello.local_rank].conn is not None
        ):
            conn.close()
            continue
        workers[hello.local_rank].conn = conn
        joined += 1


Abandon = Callable[[], "str | None"]
"""Asked while a group forms: a reason to give up on it now (the generation it was forming
was superseded), or None to go on waiting."""


def await_ready(
    workers: Sequence[WorkerHandle], *, timeout_s: float, abandon: Abandon | None = None
) -> None:
    """Wait until every worker joined the process group (or reported why it could not).

    ``abandon`` is asked every half second: a worker waits for its peers (rank 0's store, the
    group's connections) up to the collective timeout, minutes, and a peer whose node
    vanished never comes. When the generation being formed is superseded (the operator
    published the next one without that peer), waiting is pointless: this raises at once,
    ``waiting_for_peers``, and the caller shuts the workers down."""
    deadline = time.monotonic() + timeout_s
    pending = {w.conn: w for w in workers if w.conn is not None}
    while pending:
        if time.monotonic() > deadline:
            ranks = sorted(w.rank for w in pending.values())
            raise WorkerGroupStartError(
                f"rank(s) {ranks} did not join the process group", waiting_for_peers=True
            )
        if abandon is not None and (why := abandon()) is not None:
            ranks = sorted(w.rank for w in pending.values())
            raise WorkerGroupStartError(
                f"rank(s) {ranks} were still joining the process group when {why}",
                waiting_for_peers=True,
            )
        for conn in wait(list(pending), timeout=0.5):
            assert isinstance(conn, Connection)
            w = pending[conn]
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                raise WorkerGroupStartError(
                    f"rank {w.rank} worker died while joining the process group: "
                    f"{WorkerDiedError(w.rank, w.exitcode()).args[0]}"
                ) from None
            if _FORMED(msg, w):
                del pending[conn]


def _ready(_msg: Ready, _w: WorkerHandle) -> bool:
    return True


def _init_failed(msg: InitFailed, w: WorkerHandle) -> bool:
    raise WorkerGroupStartError(
        f"rank {w.rank} failed to initialize: {msg.exc_type}: {msg.message}",
        waiting_for_peers=msg.kind in ("timeout", "peer"),
    )


def _left_over(_msg: object, _w: WorkerHandle) -> bool:
    return False  # an event or a result left over from an abandoned task


_FORMED = Dispatcher[bool]({Ready: _ready, InitFailed: _init_failed}, otherwise=_left_over)
"""A worker's answer to its start or re-formation: True once it joined; raises if it failed."""
