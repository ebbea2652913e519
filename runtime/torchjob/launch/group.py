"""WorkerGroup: N local worker processes forming one ``torch.distributed`` process group.

The driver (``TorchTrainer.fit``, the RaySGD trainer, tests) owns a group, sends it
functions and gets per-rank results back. Each worker is forked from the driver where that
is safe, else a fresh interpreter (``torchjob.launch._start``), connected to the driver by
a socket (the handshake: ``torchjob.launch.startup``); the socket doubles as the liveness
signal: when it closes, the worker is gone and its exit status says why. Failures are
reduced to one root cause (``torchjob.launch.execution``, :meth:`Execution.wait`) so the
caller does not have to read N stack traces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import cloudpickle

from torchjob.launch import _start, abort, nccl, store_clients, zygote
from torchjob.launch.errors import LaunchError, WorkerDiedError
from torchjob.launch.execution import Execution, WorkerHandle
from torchjob.launch.placement import Placement
from torchjob.launch.startup import (
    accept_workers,
    await_ready,
    check_gpu_count,
    rank_env,
    resolve_backend,
    spawn_env,
)
from torchjob.launch.worker import ENV_DRIVER_PID, ENV_STORE_SERVED

T = TypeVar("T")


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
        check_gpu_count(num_workers, use_gpu)
        self._num_workers = num_workers
        self._backend = resolve_backend(backend, use_gpu)
        self._use_gpu = use_gpu
        self._timeout_s = timeout_s
        self._placement = placement
        self._store_server: Any = None
        """The local group's rendezvous store, served by this process (:meth:`_with_store`)."""
        self._formations = 0
        """How many times this group formed in that store (keys each formation apart)."""
        self._env = dict(env or {})
        self._init_hook = init_hook
        self._start_timeout_s = start_timeout_s
        self._workers: list[WorkerHandle] = []
        self._server: socket.socket | None = None
        self._next_task = 0
        self._broken = False
        self._busy = False
        self._formed = False
        self._peer_loss_only = False
        self._survivors = False
        self._token = ""
        self._init: dict[str, Any] = {}
        self.start_method: _start.StartMethod | None = None
        self.start_why = ""
        """How the last worker started, in words (``forked from the copy zygote (pid N)``)."""
        """How the last worker started: from the zygote, forked from this process, or a fresh
        interpreter (``torchjob.launch._start``)."""

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
        self._placement = self._with_store(self._placement, form=form)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(self._num_workers)
        self._server = server
        token = self._token = secrets.token_hex(16)
        try:
            for local_rank in range(self._num_workers):
                self._workers.append(self._spawn(local_rank, token))
            accept_workers(self._server, self._workers, token, timeout_s=self._start_timeout_s)
            init = {
                "sys_path": list(sys.path),
                "backend": self._backend,
                "use_gpu": self._use_gpu,
                "timeout_s": self._timeout_s,
                "init_hook": cloudpickle.dumps(self._init_hook) if self._init_hook else None,
                "form": form,
            }
            self._init = init
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
        its processes leave the dead group and join the next one (an NCCL group only with
        ``TORCHJOB_NCCL_REFORM=1``, unverified: ``torchjob.launch.nccl.in_place``)."""
        healthy = not self._broken or (self._peer_loss_only and nccl.in_place(self._backend))
        return (
            bool(self._workers)
            and healthy
            and all(w.conn is not None and w.proc.poll() is None for w in self._workers)
            and placement.local_world_size == self._num_workers
        )

    def peer_lost(self) -> None:
        """A worker died (:class:`Execution`): an NCCL group's survivors are told to abort
        their communicators (``torchjob.launch.abort``), which would otherwise wait on it
        until the timeout. (A gloo group learns of it from its closed connections.)"""
        if self._backend == "nccl" and nccl.enabled() and (p := self._placement).master_port:
            abort.request_abort(p.master_addr, p.master_port, p.generation)

    def reform(self, placement: Placement, env: dict[str, str] | None = None) -> None:
        """Move the running workers into the process group ``placement`` names, in place.

        Each worker leaves its current group (if any) and joins the new one in the same
        process: no new interpreter, no import, and what it holds (``worker_state``, the
        CUDA context) stays. Ranks and the environment follow ``placement`` and ``env``,
        as :meth:`start` would set them. Raises :class:`WorkerGroupStartError` like
        :meth:`start` (the group is then broken: shut it down)."""
        if not self.can_reform(placement):
            raise LaunchError("this worker group cannot be re-formed; start a new one")
        self._env.update(env or {})
        self._placement = self._with_store(placement, form=True)
        try:
            for w in self._workers:
                assert w.conn is not None
                w.conn.send(("reform", self._rank_env(w.local_rank, with_base=False)))
            self._await_ready()
        except BaseException:
            self._broken, self._peer_loss_only, self._survivors = True, False, False
            raise
        for w in self._workers:
            w.rank = self._placement.rank_offset + w.local_rank
        self._formed = True
        self._broken = self._peer_loss_only = self._survivors = False

    def _with_store(self, placement: Placement, *, form: bool) -> Placement:
        """``placement`` with its store's port. A local group's store (port 0: this process
        picks it) is served by this process, the driver, for the group's life, where the
        driver imported torch: a lost rank 0 then moves nothing, and every survivor keeps its
        connections to the store across re-formations (``torchjob.launch.store_clients``), so
        a re-formation opens none (new connections cost 5 s per re-formation at 32 gloo ranks
        on the 2-core sandbox, docs/runtime.md). Else rank 0 serves it (a pod's group: its
        port is the job's; a driver without torch: a new port per generation)."""
        # Not where workers are forked from the driver itself: the store's thread would be
        # a thread the fork does not carry (``_start``: the fork path needs none).
        start = self._env.get(_start.ENV_START) or os.environ.get(_start.ENV_START)
        served = form and not placement.master_port and "torch" in sys.modules and start != "fork"
        if not served:
            self._env[ENV_STORE_SERVED] = "0"
            return placement.with_port()
        # The store outlives a formation: each keys its rendezvous apart, whatever its
        # generation (a WorkerGroup may re-form into the same one).
        self._formations += 1
        self._env[ENV_STORE_SERVED] = str(self._formations)
        if self._store_server is None:
            timeout = timedelta(seconds=self._timeout_s)
            self._store_server = store_clients.serve(placement.master_addr, timeout)
        return dataclasses.replace(placement, master_port=self._store_server.port)

    def _rank_env(self, local_rank: int, *, with_base: bool = True) -> dict[str, str]:
        return rank_env(self._placement, self._env, local_rank, with_base=with_base)

    def _spawn(self, local_rank: int, token: str) -> WorkerHandle:
        p = self._placement
        rank = p.rank_offset + local_rank
        assert self._server is not None
        host, port = self._server.getsockname()
        env = spawn_env(
            self._rank_env(local_rank),
            driver=f"{host}:{port}",
            token=token,
            use_gpu=self._use_gpu,
            backend=self._backend,
            local_world_size=p.local_world_size,
            group_env=self._env,
        )
        env[ENV_DRIVER_PID] = str(os.getpid())
        proc, self.start_method, self.start_why = zygote.start_worker(
            env, use_gpu=self._use_gpu, backend=self._backend
        )
        return WorkerHandle(local_rank=local_rank, rank=rank, proc=proc)

    def _await_ready(self) -> None:
        await_ready(self._workers, timeout_s=self._start_timeout_s + self._timeout_s)

    def mark_broken(self, *, peer_loss_only: bool, survivors: bool = False) -> None:
        """After a failed execution (:class:`Execution`): peers may be stuck in a collective.
        ``peer_loss_only``: every local rank answered, each with a broken connection to
        another host (see :meth:`can_reform`). ``survivors``: every local rank answered,
        each either dead or with a broken connection (see :meth:`heal`)."""
        self._broken = True
        self._peer_loss_only = peer_loss_only
        self._survivors = survivors

    # --- keeping the survivors of a lost rank ---------------------------------------------
    def lost(self) -> list[int]:
        """Local ranks whose process is gone."""
        return [w.local_rank for w in self._workers if w.conn is None or w.proc.poll() is not None]

    def survivable(self) -> bool:
        """After a failed execution: some processes live on, and can re-form in place
        (:meth:`heal`): a gloo group whose failures were only deaths and broken connections
        (no rank hung, none raised an error of its own)."""
        ok = not self._broken or self._survivors or self._peer_loss_only
        return ok and nccl.in_place(self._backend) and len(self._workers) - len(self.lost()) > 0

    def heal(self, num_workers: int) -> None:
        """Keep the survivors after a lost rank: drop the dead processes, start new ones
        (unformed) up to ``num_workers`` or drop the last survivors down to it, and renumber
        the local ranks (survivors first, in rank order). :meth:`reform` then forms the next
        group in these processes. Raises :class:`WorkerGroupStartError` when a new process
        does not start (the group is then broken: shut it down)."""
        if not self.survivable():
            raise LaunchError("this worker group has no survivors to keep; start a new one")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not self.heals_to(num_workers):
            raise LaunchError("an NCCL group re-forms in place at its own size only")
        lost = self.lost()
        alive = [w for w in self._workers if w.local_rank not in lost]
        for w in [w for w in self._workers if w.local_rank in lost] + alive[num_workers:]:
            self._reap(w)  # the dead, and the last survivors of a shrink beyond the losses
        alive = alive[:num_workers]
        if self._backend == "nccl":  # a survivor keeps its slot (its GPU, its model on it)
            slots = lost  # a replacement takes a lost rank's slot
        else:
            for i, w in enumerate(alive):
                w.local_rank = i
            slots = list(range(len(alive), num_workers))
        self._num_workers = num_workers
        self._placement = Placement.local(num_workers, generation=self._placement.generation)
        self._broken = self._peer_loss_only = self._survivors = False
        new = [self._spawn(i, self._token) for i in slots]
        self._workers = sorted(alive + new, key=lambda w: w.local_rank)
        if not new:
            return
        try:
            assert self._server is not None
            accept_workers(
                self._server, self._workers, self._token, timeout_s=self._start_timeout_s
            )
            for w in new:
                assert w.conn is not None
                w.conn.send(("init", {**self._init, "form": False}))
            await_ready(new, timeout_s=self._start_timeout_s)
        except BaseException:
            self._broken, self._peer_loss_only = True, False
            raise

    def heals_to(self, num_workers: int) -> bool:
        """Whether :meth:`heal` can make this group ``num_workers`` strong: an NCCL group only
        at its own size (its survivors keep their GPUs)."""
        return self._backend != "nccl" or num_workers == self._num_workers

    def _reap(self, w: WorkerHandle) -> None:
        """Kill the worker's session (it and what it started), wait for it, drop its line."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
        if w.conn is not None:
            w.conn.close()
            w.conn = None

    def kill_rank(self, rank: int, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to the process of global rank ``rank`` if this host runs it (a silent
        peer is killed so that its connections close); False if not here or gone."""
        for w in self._workers:
            if w.rank == rank and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.proc.pid, sig)
                return True
        return False

    def shutdown(self, timeout_s: float = 10) -> None:
        """Ask workers to exit; kill those still alive after ``timeout_s`` (and their children)."""
        for w in self._workers:
            if w.conn is not None and w.proc.poll() is None and not self._broken:
                with contextlib.suppress(OSError):
                    w.conn.send(("exit",))
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(
                    timeout=max(0.0, deadline - time.monotonic()) if timeout_s > 0 else 0.01
                )
            self._reap(w)  # killed if still alive, with what it started (DataLoader workers)
        self._workers = []
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._store_server is not None:  # after the workers: they may still ask
            store_clients.stop_serving(self._store_server)
            self._store_server = None

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
