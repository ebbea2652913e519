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

from torchjob.launch import abort, nccl, pickling, store_clients, zygote
from torchjob.launch._start import StartMethod
from torchjob.launch._survivors import Survivors
from torchjob.launch.errors import LaunchError, WorkerDiedError
from torchjob.launch.execution import Execution, WorkerHandle, write_stacks
from torchjob.launch.group_state import GroupState
from torchjob.launch.layout import StoreLayout
from torchjob.launch.placement import Placement
from torchjob.launch.protocol import Exit, Init, Reform, Run
from torchjob.launch.settings import ENV_STORE_SERVED, RuntimeSettings
from torchjob.launch.startup import (
    Abandon,
    accept_workers,
    await_ready,
    check_gpu_count,
    rank_env,
    resolve_backend,
    spawn_env,
)

T = TypeVar("T")


class WorkerGroup(Survivors):
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
        start_timeout_s: float | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        placement = placement or Placement.local(num_workers)
        if placement.local_world_size != num_workers:
            raise ValueError(
                f"num_workers={num_workers} but placement runs {placement.local_world_size} locally"
            )
        check_gpu_count(num_workers, use_gpu)
        self._env = dict(env or {})
        self.settings = RuntimeSettings.from_env({**os.environ, **self._env})
        """The runtime settings of this group (the driver's environment under ``env``, as
        its workers see them), read once here."""
        self._num_workers = num_workers
        self._backend = resolve_backend(backend, use_gpu)
        self._use_gpu = use_gpu
        self._timeout_s = timeout_s
        self._placement = placement
        self._store = store_clients.DriverStore(
            timedelta(seconds=timeout_s), use_libuv=self.settings.use_libuv
        )
        """The local group's rendezvous store, served by this process (:meth:`_with_store`)."""
        self._init_hook = init_hook
        self._start_timeout_s = (
            self.settings.start_timeout_s if start_timeout_s is None else start_timeout_s
        )
        """How long the workers may take to connect (``TORCHJOB_WORKER_START_TIMEOUT_S``)."""
        self._workers: list[WorkerHandle] = []
        self._server: socket.socket | None = None
        self._next_task = 0
        self.state = GroupState.NEW
        """Where the group is in its life (``torchjob.launch.group_state``)."""
        self._token = ""
        self._init: Init | None = None
        self.start_method: StartMethod | None = None
        """How the last worker started: from the zygote, forked from this process, or a fresh
        interpreter (``torchjob.launch._start``)."""
        self.start_why = ""
        """How the last worker started, in words (``forked from the copy zygote (pid N)``)."""
        self.abandon: Abandon | None = None
        """Asked while the workers form a group (:meth:`start`, :meth:`reform`): a reason to
        give up on that formation now (``torchjob.launch.startup.await_ready``)."""

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
        return self.state.broken

    # --- lifecycle ------------------------------------------------------------------
    def start(self, *, form: bool = True) -> None:
        """Spawn the workers, wait until all joined the process group and ran ``init_hook``.

        With ``form=False`` the workers start, import torch and wait unformed: a
        :meth:`reform` forms their first group later (a pod that joins a running job
        imports while it waits for its generation)."""
        if self._workers:
            raise LaunchError("worker group already started")
        self.state = self.state.started(form=form)
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
            init = self._init = Init(
                sys_path=tuple(sys.path),
                backend=self._backend,
                use_gpu=self._use_gpu,
                timeout_s=self._timeout_s,
                init_hook=pickling.dumps(self._init_hook) if self._init_hook else None,
                form=form,
            )
            for w in self._workers:
                assert w.conn is not None
                w.conn.send(init)
            self._await_ready()
        except BaseException:
            self.shutdown(timeout_s=0)
            raise

    @property
    def formed(self) -> bool:
        """True once the workers are in a process group (see ``start(form=False)``)."""
        return self.state.formed

    def can_reform(self, placement: Placement) -> bool:
        """Whether :meth:`reform` can move this group's processes to ``placement``.

        Not after a failure of its own; but a gloo group broken only because another host's
        ranks vanished (every local rank raised a broken connection, none hung or died) can:
        its processes leave the dead group and join the next one (an NCCL group only with
        ``TORCHJOB_NCCL_REFORM=1``, unverified: ``torchjob.launch.nccl.in_place``)."""
        in_place = nccl.in_place(self._backend, self.settings)
        return (
            bool(self._workers)
            and self.state.reformable(in_place=in_place)
            and all(w.conn is not None and w.proc.poll() is None for w in self._workers)
            and placement.local_world_size == self._num_workers
        )

    def peer_lost(self) -> None:
        """A worker died (:class:`Execution`): an NCCL group's survivors are told to abort
        their communicators (``torchjob.launch.abort``), which would otherwise wait on it
        until the timeout. (A gloo group learns of it from its closed connections.)"""
        if self._backend == "nccl" and nccl.enabled(self.settings) and self._placement.master_port:
            abort.request_abort(self.store_layout())

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
                w.conn.send(Reform(self._rank_env(w.local_rank, with_base=False)))
            self._await_ready()
        except BaseException:
            self.state = self.state.errored()
            raise
        for w in self._workers:
            w.rank = self._placement.rank_offset + w.local_rank
        self.state = self.state.reformed(in_place=nccl.in_place(self._backend, self.settings))

    def store_layout(self) -> StoreLayout:
        """The current generation's store, as its workers see it (``torchjob.launch.layout``)."""
        p = self._placement
        use_libuv = self.settings.use_libuv
        return StoreLayout(
            p.master_addr, p.master_port, p.generation, self._store.formation, use_libuv
        )

    def _with_store(self, placement: Placement, *, form: bool) -> Placement:
        """``placement`` with its store's port: the driver's store for a local group where it
        imported torch (``store_clients.DriverStore``), else rank 0's."""
        # Not where workers are forked from the driver itself: the store's thread would be
        # a thread the fork does not carry (``_start``: the fork path needs none).
        start = self.settings.worker_start
        served = form and not placement.master_port and "torch" in sys.modules and start != "fork"
        placement = self._store.place(placement, served=served)
        self._env[ENV_STORE_SERVED] = str(self._store.formation)
        return placement

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
            settings=self.settings,
        )
        proc, self.start_method, self.start_why = zygote.start_worker(
            env, use_gpu=self._use_gpu, backend=self._backend
        )
        return WorkerHandle(local_rank=local_rank, rank=rank, proc=proc)

    def _await_ready(self) -> None:
        await_ready(
            self._workers, timeout_s=self._start_timeout_s + self._timeout_s, abandon=self.abandon
        )

    def mark_broken(self, *, peer_loss_only: bool, survivors: bool = False) -> None:
        """After a failed execution (:class:`Execution`): peers may be stuck in a collective.
        ``peer_loss_only``: every local rank answered, each with a broken connection to
        another host (see :meth:`can_reform`). ``survivors``: every local rank answered,
        each either dead or with a broken connection (see :meth:`heal`)."""
        self.state = self.state.failed(peer_loss_only=peer_loss_only, survivors=survivors)

    def kill_rank(self, rank: int, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to the process of global rank ``rank`` if this host runs it (a silent
        peer is killed so that its connections close); False if not here or gone."""
        for w in self._workers:
            if w.rank == rank and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.proc.pid, sig)
                return True
        return False

    def shutdown(self, timeout_s: float = 10) -> int:
        """Ask workers to exit; kill those still alive after ``timeout_s`` (and their children).
        Returns how many had to be killed. A broken group's workers are not asked (one may
        still hang in a collective with a peer that is gone), so they are killed at once:
        waiting for them only kept a pod that had stopped 10 s longer, paid for and holding
        its name (bench/results/2026-12-03c: a kept group released at a pod's exit)."""
        if self.state.broken:
            timeout_s = 0
        killed = 0
        for w in self._workers:
            if w.conn is not None and w.proc.poll() is None and not self.state.broken:
                with contextlib.suppress(OSError):
                    w.conn.send(Exit())
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            try:
                w.proc.wait(
                    timeout=max(0.0, deadline - time.monotonic()) if timeout_s > 0 else 0.01
                )
            except subprocess.TimeoutExpired:
                killed += 1
            self._reap(w)  # killed if still alive, with what it started (DataLoader workers)
        self._workers = []
        if self._server is not None:
            self._server.close()
            self._server = None
        self._store.stop()  # after the workers: they may still ask
        return killed

    def __enter__(self) -> WorkerGroup:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(timeout_s=10)

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
        if self.state.broken:
            raise LaunchError("worker group is broken by an earlier failure; shut it down")
        chosen = [self._workers[i] for i in (local_ranks or range(self._num_workers))]
        self._next_task += 1
        run = Run(self._next_task, pickling.dumps((fn, tuple(args), dict(kwargs or {}))))
        for w in chosen:
            if w.conn is None:
                raise WorkerDiedError(w.rank, w.proc.poll())
            try:
                w.conn.send(run)
            except OSError:
                self.state = self.state.errored()
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

    def kill_with_stacks(self, land_s: float = 0.3) -> None:
        """Kill every live worker, every thread's Python stack written to its stderr first
        (``worker.STACK_SIGNAL``: faulthandler writes from its C handler, also while the
        thread waits inside a C call such as a gloo collective): a kill whose cause is not
        known leaves on record where the workers were."""
        write_stacks([w.proc for w in self._workers], land_s)
        self.signal(signal.SIGKILL)
