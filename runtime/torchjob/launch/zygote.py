"""A zygote: one small process that imported torch once, never touched CUDA, and forks the
workers on request (``torchjob.launch._start`` decides when it is used).

Forking a worker from the driver is the cheapest start there is (no second ``import torch``),
but only while the driver is single-threaded and CUDA-free: a pod's driver runs the
``MembershipWatch`` thread, a GPU driver asks ``torch.cuda`` how many devices there are, and a
notebook runs threads from the start. The zygote is made once, before any of that:

* a **copy** of the driver (``os.fork``) when the driver is safe to copy at :func:`prepare`
  (``fit()`` calls it first, before it starts a thread or asks ``torch.cuda`` anything): the
  workers share every module the user's script imported;
* else a **fresh** interpreter (``python -m torchjob.launch._zygote_proc``) that imports torch,
  the worker loop and the modules the training function's globals name: one import in all,
  instead of one per worker.

Either then imports what every worker's first step needs (DDP's compiler stack) once, and
serves fork requests over a ``SOCK_SEQPACKET`` socket: the driver sends the worker's
environment, its working directory and its current stdin/stdout/stderr (as descriptors);
the zygote checks that it never touched CUDA (``torchjob.launch.cuda_guard``), forks, and answers with
the pid. It reaps its children and sends each exit status (``-N`` for a signal) back, which
:class:`ZygoteProcess` (the driver's handle, a ``ProcessHandle``) reads. When the zygote is
gone (killed, or it refused because it touched CUDA) new workers are spawned as fresh
interpreters, with a log line; workers it already started keep running (they watch the
driver, ``TORCHJOB_LAUNCH_DRIVER_PID``), but their exit status is lost (:data:`EXIT_UNKNOWN`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from torchjob.launch import _start, _zygote_proc, protocol
from torchjob.launch._zygote_proc import modules_of as modules_of  # re-exported: fit() asks
from torchjob.launch.cuda_guard import (
    copyable,
    cuda_touched,
    install_tripwire,
    openmp_pool_started,
)
from torchjob.launch.errors import EXIT_UNKNOWN
from torchjob.launch.settings import SLOW_EXIT_S, RuntimeSettings

log = logging.getLogger(__name__)

_FRESH_MAIN = (
    "import os, sys\nfrom torchjob.launch._zygote_proc import main\nos._exit(main(sys.argv[1:]))\n"
)

Kind = Literal["copy", "fresh"]
BASE_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torchjob.train._worker_loop")


# --- the driver's side -----------------------------------------------------------------------
class ZygoteError(RuntimeError):
    """The zygote cannot start a worker (gone, refused, or not ready in time)."""


class Zygote:
    """The driver's connection to one zygote process."""

    def __init__(self, kind: Kind, sock: socket.socket, proc: Any, omp_clean: bool) -> None:
        self.kind = kind
        self.sock = sock
        self.extra: tuple[str, ...] = ()
        """What a fresh zygote imported beyond torch and the worker loop: the training
        function's modules."""
        self.proc = proc  # a Popen (fresh) or a pid (copy)
        self.omp_clean = omp_clean
        """No OpenMP pool can exist in the zygote: its workers may run any number of threads
        (a pool used before a fork hangs the child's first parallel region)."""
        self.pid = proc if isinstance(proc, int) else proc.pid
        if not _AT_EXIT:  # the driver reaps its zygotes (and so counts their CPU time)
            _AT_EXIT.append(atexit.register(shutdown))
        self.ready = False
        self.dead: str | None = None
        self.exits: dict[int, int] = {}
        self._replies: dict[int, protocol.Forked | protocol.Refused] = {}
        self._next = 0
        self._receive = protocol.Dispatcher[None](
            {
                protocol.ChildExited: self._exited,
                protocol.ZygoteReady: self._ready,
                protocol.Forked: self._reply,
                protocol.Refused: self._reply,
            }
        )

    @classmethod
    def copy(cls, preload: Iterable[str] = BASE_PRELOAD) -> Zygote:
        """Fork the zygote from this (single-threaded, CUDA-free) driver."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A driver that imported torch but never ran a parallel op has no OpenMP pool yet:
        # its copy may serve workers of any thread count (asked of a child, 10-50 ms).
        omp_clean = not openmp_pool_started()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ours.close()
                _ZYGOTES.clear()  # the driver's zygotes are not this process's
                os.setsid()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
                    signal.signal(sig, signal.SIG_DFL)
                _zygote_proc.neutralize_fds({theirs.fileno()})
                _zygote_proc.serve(theirs, preload)
            except BaseException:
                code = 1
            os._exit(code)
        theirs.close()
        return cls("copy", ours, pid, omp_clean)

    @classmethod
    def fresh(cls, preload: Iterable[str] = ()) -> Zygote:
        """Start the zygote as a fresh interpreter that runs ``_zygote_proc.main``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
        names = list(dict.fromkeys([*BASE_PRELOAD, *preload]))
        proc = subprocess.Popen(
            # -c, not -m: torchjob.launch imports _zygote_proc, and runpy would run it a second
            # time as __main__ (a RuntimeWarning on every pod's stderr, and two copies).
            [sys.executable, "-c", _FRESH_MAIN, str(theirs.fileno()), *names],
            pass_fds=[theirs.fileno()],
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )
        theirs.close()
        zygote = cls("fresh", ours, proc, omp_clean=True)
        zygote.extra = tuple(n for n in names if n not in BASE_PRELOAD)
        return zygote

    def alive(self) -> bool:
        self.pump(0)
        return self.dead is None

    def pump(self, timeout: float) -> None:
        """Read what the zygote sent (ready, replies, exits) for up to ``timeout`` seconds."""
        while self.dead is None:
            if not select.select([self.sock], [], [], timeout)[0]:
                return
            timeout = 0
            try:
                data = self.sock.recv(_zygote_proc.BUF)
            except OSError:
                data = b""
            if not data:
                self._died("it exited")
                return
            self._receive(pickle.loads(data))

    def _exited(self, msg: protocol.ChildExited) -> None:
        self.exits[msg.pid] = msg.code

    def _ready(self, msg: protocol.ZygoteReady) -> None:
        self.ready = True
        if msg.cuda_touched:
            self._died(f"it touched CUDA ({msg.cuda_touched})")

    def _reply(self, msg: protocol.Forked | protocol.Refused) -> None:
        self._replies[msg.req] = msg

    def _died(self, why: str) -> None:
        self.dead = why
        self.close()

    def fork(self, env: Mapping[str, str], *, timeout_s: float = 120.0) -> ZygoteProcess:
        """A worker with ``env``, the driver's cwd and stdio; raises :class:`ZygoteError`."""
        self._next += 1
        req = self._next
        which = [fd for fd in (0, 1, 2) if _valid(fd)]
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = ""
        msg = pickle.dumps(protocol.ForkRequest(req, dict(env), cwd, tuple(which)))
        try:
            socket.send_fds(self.sock, [msg], which)
        except OSError as exc:
            self._died(f"its socket failed: {exc}")
        deadline = time.monotonic() + timeout_s
        while req not in self._replies and self.dead is None:
            left = deadline - time.monotonic()
            if left <= 0:
                self._died(f"no answer within {timeout_s:.0f}s")
                break
            self.pump(min(left, 1.0))
        reply = self._replies.pop(req, None)
        if reply is None:
            raise ZygoteError(f"the zygote is gone: {self.dead}")
        if isinstance(reply, protocol.Refused):
            self._died(f"it refused to fork: {reply.why}")
            raise ZygoteError(f"the zygote refused to fork: {reply.why}")
        return ZygoteProcess(self, reply.pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.dead is None:
            self.dead = "closed"
        if isinstance(self.proc, int):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.proc, os.WNOHANG)
        else:
            self.proc.poll()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Close the zygote's socket (it exits) and wait for it; said in the log when slow
        (a stopping pod is paid for until it is gone)."""
        self.close()
        t0 = time.monotonic()
        while not self._gone() and time.monotonic() < t0 + timeout_s:
            time.sleep(0.01)
        if (took := time.monotonic() - t0) > SLOW_EXIT_S:
            print(f"[torchjob] the {self.kind} zygote took {took:.1f}s to exit", file=sys.stderr)

    def _gone(self) -> bool:
        if isinstance(self.proc, int):
            try:
                return bool(os.waitpid(self.proc, os.WNOHANG)[0])
            except ChildProcessError:
                return True
        return self.proc.poll() is not None


def _valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class ZygoteProcess:
    """A worker forked by a zygote, with the part of ``Popen``'s interface the group uses:
    the exit status comes from the zygote (``-N`` for signal ``N``); :data:`EXIT_UNKNOWN`
    once the zygote is gone and so is the worker."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)  # liveness if the zygote dies; no pid reuse

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        z = self.zygote
        z.pump(0)
        if self.pid in z.exits:
            self._done(z.exits.pop(self.pid))
        elif z.dead is not None and not self._running():
            self._done(EXIT_UNKNOWN)
        return self.returncode

    def _running(self) -> bool:
        if self._pidfd is not None:
            return not select.select([self._pidfd], [], [], 0)[0]
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _done(self, code: int) -> None:
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            if self.zygote.dead is None:
                self.zygote.pump(left)
            else:
                time.sleep(left)
        return code


# --- this driver's zygotes ------------------------------------------------------------------
_ZYGOTES: dict[Kind, Zygote] = {}
_PRELOAD: list[str] = []
_WARNED: set[str] = set()
_AT_EXIT: list[object] = []


def prepare(preload: Iterable[str] = ()) -> Kind | None:
    """Make this driver's zygote now, while that is safe: a copy of the driver if it is
    single-threaded and CUDA-free, else a fresh one (importing ``preload`` besides the
    worker's modules). ``fit()`` calls it first; call it early in a driver that starts
    threads or asks ``torch.cuda`` before ``fit()``. The kind, or None off Linux."""
    _PRELOAD[:] = list(dict.fromkeys([*_PRELOAD, *preload]))
    if RuntimeSettings.from_env().worker_start not in ("auto", "zygote"):
        return None
    live = {k: z for k, z in _ZYGOTES.items() if z.alive()}
    if "copy" in live or not sys.platform.startswith("linux"):
        return "copy" if live else None
    install_tripwire()
    why = copyable(
        platform=sys.platform,
        touched=cuda_touched(probe_fork=True),
        # A store this driver serves (``store_clients.serving()``) runs a thread of libuv's
        # own, not counted here: it only waits on its sockets, holding nothing the copy needs,
        # and the copy and its workers never touch the inherited store (store_clients) and
        # never tear it down (they leave with os._exit).
        other_threads=threading.active_count() - 1,
    )
    if why is None:
        _ZYGOTES["copy"] = Zygote.copy()
        return "copy"
    if "fresh" not in live:
        _ZYGOTES["fresh"] = Zygote.fresh(_PRELOAD)
    return "fresh"


def start(env: Mapping[str, str]) -> tuple[ZygoteProcess | None, str]:
    """A worker with ``env`` from this driver's zygote, or None and why not (the caller
    spawns it). A worker that asks for more than one OpenMP thread needs a zygote that never
    had a pool (a fresh one, or a copy of a driver that had not imported torch)."""
    if not _ZYGOTES and prepare() is None:
        return None, f"zygotes are only used on Linux, not {sys.platform}"
    copy = _ZYGOTES.get("copy")
    if copy is not None and (copy.omp_clean or env.get("OMP_NUM_THREADS") == "1"):
        chosen = copy
    else:  # made once; a zygote that died is not replaced (its workers spawn instead)
        chosen = _ZYGOTES.get("fresh") or _ZYGOTES.setdefault("fresh", Zygote.fresh(_PRELOAD))
    for _ in range(2):
        if chosen.alive():
            try:
                return chosen.fork(env), f"forked from the {chosen.kind} zygote (pid {chosen.pid})"
            except ZygoteError:
                pass
        if chosen.kind != "fresh" or not chosen.extra or chosen.dead == "closed":
            break
        # One of the training function's modules asked torch.cuda at import (a module-level
        # ``torch.cuda.is_available()`` is common) or started a thread: that zygote may not
        # fork. Once, a zygote of torch alone instead (the workers import those modules).
        log.info(
            "torchjob: the zygote that imported %s cannot fork (%s); a zygote without them",
            ", ".join(chosen.extra),
            chosen.dead,
        )
        chosen = _ZYGOTES["fresh"] = Zygote.fresh(())
    why = f"the {chosen.kind} zygote (pid {chosen.pid}) is unusable: {chosen.dead}"
    if why not in _WARNED:
        _WARNED.add(why)
        log.warning("torchjob: %s; starting workers as fresh interpreters", why)
    return None, why


def start_worker(
    env: Mapping[str, str], *, use_gpu: bool, backend: str
) -> tuple[_start.ProcessHandle, _start.StartMethod, str]:
    """Start a worker with ``env`` the way :func:`choose` says (the zygote falling back to a
    fresh interpreter when it is unusable, the zygote's :func:`start` logs why): the process,
    how it started, and why that way (``forked from the copy zygote (pid N)``)."""
    method, why = _start.current_choice(env, use_gpu=use_gpu, backend=backend)
    if method == "zygote":
        proc, why = start(env)
        if proc is not None:
            return proc, "zygote", why
        method = "spawn"
    if method == "fork":
        return _start.ForkedProcess(env), "fork", why
    return _start.spawn(env), "spawn", why


def shutdown() -> None:
    """Stop this driver's zygotes (tests; a driver's zygotes exit with it anyway)."""
    for kind in list(_ZYGOTES):
        _ZYGOTES.pop(kind).shutdown()
    _WARNED.clear()
