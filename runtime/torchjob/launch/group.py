"""WorkerGroup: N local worker processes forming one ``torch.distributed`` process group.

The driver (``TorchTrainer.fit``, the RaySGD trainer, tests) owns a group, sends
it functions and gets per-rank results back. Each worker is forked from the driver where
that is safe, else a fresh interpreter (``torchjob.launch._start``), connected to the
driver by a socket; the
socket doubles as the liveness signal: when it closes, the worker is gone and its
exit status says why. Failures are reduced to one root cause (see
:meth:`Execution.wait`) so the caller does not have to read N stack traces.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Generic, TypeVar

import cloudpickle

from torchjob import contract
from torchjob.launch import _start
from torchjob.launch.errors import (
    CollectiveTimeoutError,
    LaunchError,
    WorkerDiedError,
    WorkerGroupError,
    WorkerGroupStartError,
)
from torchjob.launch.placement import Placement
from torchjob.launch.worker import ENV_DRIVER_ADDR, ENV_TOKEN

T = TypeVar("T")
EventHandler = Callable[[int, Any], None]
"""``on_event(rank, payload)``: a payload a worker sent with :func:`send_event`."""


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


def _check_gpu_count(num_workers: int, use_gpu: bool) -> None:
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


@dataclass
class _Worker:
    local_rank: int
    rank: int
    proc: _start.WorkerProcess
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

    def __init__(self, group: WorkerGroup, task_id: int, workers: list[_Worker]) -> None:
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
    ) -> list[T]:
        """Results in rank order, or raise the root cause of the failure.

        After the first failure the others get ``grace_s`` to report theirs, so that
        a worker death is preferred over the broken-connection errors it causes in
        its peers, and a collective timeout can name the rank that never joined.
        ``on_tick`` runs about every ``tick_s`` seconds (the trainer polls signals
        and scaling decisions there).
        """
        pending = {w.conn: w for w in self._workers if w.conn is not None}
        results: dict[int, T] = {}
        failures: list[_Failure] = []
        first_failure: float | None = None
        while pending:
            if first_failure is not None and time.monotonic() - first_failure > grace_s:
                break
            for conn in wait(list(pending), timeout=tick_s):
                assert isinstance(conn, Connection)
                worker = pending[conn]
                failure = self._receive(worker, conn, results, on_event)
                if failure is None and worker.local_rank not in results:
                    continue
                del pending[conn]
                if failure is not None:
                    failures.append(failure)
                    first_failure = first_failure or failure.at
            if on_tick is not None:
                on_tick()
        if failures:
            # Peers may be stuck in a collective unless every rank returned a plain exception.
            if pending or any(f.kind != "user" for f in failures):
                self._group._broken = True
                # Every local rank answered, each with a broken connection to another host:
                # the processes themselves are sound (see ``WorkerGroup.can_reform``).
                self._group._peer_loss_only = not pending and all(
                    f.kind == "peer" for f in failures
                )
            raise _root_cause(failures, hung=[w.rank for w in pending.values()])
        return [results[w.local_rank] for w in self._workers]

    def _receive(
        self,
        worker: _Worker,
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
        kind = msg[0]
        if msg[1] != self._task_id:
            return None  # left over from an earlier, abandoned task
        if kind == "event":
            if on_event is not None:
                on_event(worker.rank, cloudpickle.loads(msg[2]))
            return None
        if kind == "ok":
            results[worker.local_rank] = cloudpickle.loads(msg[2])
            return None
        _, _, exc_type, message, tb, failure_kind = msg
        err = WorkerGroupError(worker.rank, exc_type, message, tb)
        return _Failure(worker.rank, failure_kind, time.monotonic(), err)


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
            peer_failure=root.kind == "peer",
        )
    return root.error


class WorkerGroup:
    """N local worker processes (fresh interpreters) forming one torch.distributed process group.

    Use it as a context manager, or call :meth:`start` and :meth:`shutdown`.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        backend: str = "auto",
        use_gpu: bool = False,
        timeout_s: float = 300.0,
        placement: Placement | None = None,
        env: dict[str, str] | None = None,
        init_hook: Callable[[], None] | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        placement = placement or Placement.local(num_workers)
        if placement.local_world_size != num_workers:
            raise ValueError(
                f"num_workers={num_workers} but placement runs {placement.local_world_size} locally"
            )
        _check_gpu_count(num_workers, use_gpu)
        self._num_workers = num_workers
        self._backend = resolve_backend(backend, use_gpu)
        self._use_gpu = use_gpu
        self._timeout_s = timeout_s
        self._placement = placement
        self._env = dict(env or {})
        self._init_hook = init_hook
        self._start_timeout_s = start_timeout_s
        self._workers: list[_Worker] = []
        self._server: socket.socket | None = None
        self._next_task = 0
        self._broken = False
        self._busy = False
        self._formed = False
        self._peer_loss_only = False
        self.start_method: _start.StartMethod | None = None
        """How the last worker started: forked from this process, or a fresh interpreter
        (``torchjob.launch._start``)."""

    # --- properties -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self._placement.world_size

    @property
    def num_workers(self) -> int:
        """Workers on this host (equal to ``world_size`` locally)."""
        return self._num_workers

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def pids(self) -> list[int]:
        """Process ids by local rank."""
        return [w.proc.pid for w in self._workers]

    @property
    def is_broken(self) -> bool:
        """True after a failed execution: peers may be stuck in a collective; shut it down."""
        return self._broken

    # --- lifecycle ------------------------------------------------------------------
    def start(self, *, form: bool = True) -> None:
        """Spawn the workers, wait until all joined the process group and ran ``init_hook``.

        With ``form=False`` the workers start, import torch and wait unformed: a
        :meth:`reform` forms their first group later (a pod that joins a running job
        imports while it waits for its generation)."""
        if self._workers:
            raise LaunchError("worker group already started")
        self._formed = form
        self._placement = self._placement.with_port()
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(self._num_workers)
        self._server = server
        token = secrets.token_hex(16)
        try:
            for local_rank in range(self._num_workers):
                self._workers.append(self._spawn(local_rank, token))
            self._accept(token)
            init = {
                "sys_path": list(sys.path),
                "backend": self._backend,
                "use_gpu": self._use_gpu,
                "timeout_s": self._timeout_s,
                "init_hook": cloudpickle.dumps(self._init_hook) if self._init_hook else None,
                "form": form,
            }
            for w in self._workers:
                assert w.conn is not None
                w.conn.send(("init", init))
            self._await_ready()
        except BaseException:
            self.shutdown(timeout_s=0)
            raise

    @property
    def formed(self) -> bool:
        """True once the workers are in a process group (see ``start(form=False)``)."""
        return self._formed

    def can_reform(self, placement: Placement) -> bool:
        """Whether :meth:`reform` can move this group's processes to ``placement``.

        Not after a failure of its own; but a gloo group broken only because another host's
        ranks vanished (every local rank raised a broken connection, none hung or died) can:
        its processes leave the dead group and join the next one (NCCL communicators that
        saw a peer die are not safe to reuse: such a group starts new processes)."""
        healthy = not self._broken or (self._peer_loss_only and self._backend == "gloo")
        return (
            bool(self._workers)
            and healthy
            and all(w.conn is not None and w.proc.poll() is None for w in self._workers)
            and placement.local_world_size == self._num_workers
        )

    def reform(self, placement: Placement, env: dict[str, str] | None = None) -> None:
        """Move the running workers into the process group ``placement`` names, in place.

        Each worker leaves its current group (if any) and joins the new one in the same
        process: no new interpreter, no import, and what it holds (``worker_state``, the
        CUDA context) stays. Ranks and the environment follow ``placement`` and ``env``,
        as :meth:`start` would set them. Raises :class:`WorkerGroupStartError` like
        :meth:`start` (the group is then broken: shut it down)."""
        if not self.can_reform(placement):
            raise LaunchError("this worker group cannot be re-formed; start a new one")
        self._placement = placement.with_port()
        self._env.update(env or {})
        try:
            for w in self._workers:
                assert w.conn is not None
                w.conn.send(("reform", self._rank_env(w.local_rank, with_base=False)))
            self._await_ready()
        except BaseException:
            self._broken, self._peer_loss_only = True, False
            raise
        for w in self._workers:
            w.rank = self._placement.rank_offset + w.local_rank
        self._formed = True
        self._broken = self._peer_loss_only = False

    def _rank_env(self, local_rank: int, *, with_base: bool = True) -> dict[str, str]:
        """The torchrun variables of one local rank under the current placement."""
        p = self._placement
        return {
            **(dict(os.environ) if with_base else {}),
            **self._env,
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

    def _spawn(self, local_rank: int, token: str) -> _Worker:
        p = self._placement
        rank = p.rank_offset + local_rank
        assert self._server is not None
        host, port = self._server.getsockname()
        package_root = str(Path(__file__).resolve().parents[2])
        env = {
            **self._rank_env(local_rank),
            contract.PYTHONUNBUFFERED: "1",
            ENV_DRIVER_ADDR: f"{host}:{port}",
            ENV_TOKEN: token,
            "PYTHONPATH": os.pathsep.join(
                [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        # Like Ray, workers without GPUs see none, so code that picks "cuda" whenever it is
        # available (seed snippets do) stays on the CPU its model is on.
        if (
            not self._use_gpu
            and self._backend != "nccl"
            and "CUDA_VISIBLE_DEVICES" not in self._env
        ):
            env["CUDA_VISIBLE_DEVICES"] = ""
        # torchrun's default: one intra-op thread per process when several share a host.
        if "OMP_NUM_THREADS" not in env and p.local_world_size > 1:
            env["OMP_NUM_THREADS"] = "1"
        method, _why = _start.current_choice(env, use_gpu=self._use_gpu, backend=self._backend)
        proc: _start.WorkerProcess = (
            _start.ForkedProcess(env) if method == "fork" else _start.spawn(env)
        )
        self.start_method = method
        return _Worker(local_rank=local_rank, rank=rank, proc=proc)

    def _accept(self, token: str) -> None:
        assert self._server is not None
        deadline = time.monotonic() + self._start_timeout_s
        self._server.settimeout(0.5)
        joined = 0
        while joined < self._num_workers:
            if time.monotonic() > deadline:
                raise WorkerGroupStartError(
                    f"{self._num_workers - joined} worker(s) did not connect within "
                    f"{self._start_timeout_s:.0f}s"
                )
            for w in self._workers:
                code = w.proc.poll()
                if code is not None and w.conn is None:
                    raise WorkerGroupStartError(
                        f"rank {w.rank} worker exited during start-up: {WorkerDiedError(w.rank, code).args[0]}"
                    )
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            sock.settimeout(None)
            conn = Connection(sock.detach())
            hello = conn.recv()
            if hello[0] != "hello" or hello[1] != token:
                conn.close()
                continue
            self._workers[hello[2]].conn = conn
            joined += 1

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s + self._timeout_s
        pending = {w.conn: w for w in self._workers if w.conn is not None}
        while pending:
            if time.monotonic() > deadline:
                ranks = sorted(w.rank for w in pending.values())
                raise WorkerGroupStartError(
                    f"rank(s) {ranks} did not join the process group", waiting_for_peers=True
                )
            for conn in wait(list(pending), timeout=0.5):
                assert isinstance(conn, Connection)
                w = pending.pop(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    raise WorkerGroupStartError(
                        f"rank {w.rank} worker died while joining the process group: "
                        f"{WorkerDiedError(w.rank, w.exitcode()).args[0]}"
                    ) from None
                if msg[0] == "init_err":
                    _, _, exc_type, message, _tb, kind = msg
                    raise WorkerGroupStartError(
                        f"rank {w.rank} failed to initialize: {exc_type}: {message}",
                        waiting_for_peers=kind in ("timeout", "peer"),
                    )

    def shutdown(self, timeout_s: float = 10) -> None:
        """Ask workers to exit; kill those still alive after ``timeout_s`` (and their children)."""
        for w in self._workers:
            if w.conn is not None and w.proc.poll() is None and not self._broken:
                with contextlib.suppress(OSError):
                    w.conn.send(("exit",))
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            remaining = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=remaining if timeout_s > 0 else 0.01)
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
            else:
                # Reap stragglers the worker started (DataLoader workers) in its session.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
            if w.conn is not None:
                w.conn.close()
                w.conn = None
        self._workers = []
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> WorkerGroup:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(timeout_s=0 if self._broken else 10)

    # --- running functions ------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., T],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        local_ranks: Sequence[int] | None = None,
    ) -> Execution[T]:
        """Start ``fn(*args, **kwargs)`` on the workers (all by default); collect with ``wait``."""
        if not self._workers:
            raise LaunchError("worker group is not started")
        if self._broken:
            raise LaunchError("worker group is broken by an earlier failure; shut it down")
        chosen = [self._workers[i] for i in (local_ranks or range(self._num_workers))]
        self._next_task += 1
        payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
        for w in chosen:
            if w.conn is None:
                raise WorkerDiedError(w.rank, w.proc.poll())
            try:
                w.conn.send(("run", self._next_task, payload))
            except OSError:
                self._broken = True
                raise WorkerDiedError(w.rank, w.exitcode()) from None
        return Execution(self, self._next_task, chosen)

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> list[T]:
        """Run ``fn(*args, **kwargs)`` on every worker; results by local rank.

        Raises :class:`WorkerGroupError` (root-cause rank and exception),
        :class:`WorkerDiedError` or :class:`CollectiveTimeoutError`.
        """
        return self.submit(fn, args, kwargs).wait()

    def execute_single(self, rank: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the worker with global rank ``rank`` only."""
        local = rank - self._placement.rank_offset
        if not 0 <= local < self._num_workers:
            raise ValueError(f"rank {rank} is not on this host")
        return self.submit(fn, args, kwargs, local_ranks=[local]).wait()[0]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every live worker (SIGTERM: ask them to stop at the next step)."""
        for w in self._workers:
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.proc.pid, sig)
