"""The zygote process (a fresh interpreter running :func:`main` with ``FD MODULE...``, or a
fork of the driver): preload, then fork a worker per request and report each worker's exit status.
The driver's side, and why, is ``torchjob.launch.zygote``."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable

from torchjob.launch import _child
from torchjob.launch.cuda_guard import cuda_touched, install_tripwire
from torchjob.launch.protocol import (
    ChildExited,
    Forked,
    ForkRequest,
    ProtocolError,
    Refused,
    ZygoteReady,
)

BUF = 1 << 20


def modules_of(fn: object) -> list[str]:
    """The modules a function's globals (and ``__main__``'s) come from: what a fresh zygote
    imports so that the workers find them loaded when they unpickle the function."""
    spaces = [getattr(fn, "__globals__", {}), vars(sys.modules.get("__main__", sys))]
    names: list[str] = []
    for space in spaces:
        for value in list(space.values()):
            try:
                name = value.__name__ if isinstance(value, type(sys)) else value.__module__
            except Exception:  # no module, or an object that refuses to say
                continue
            if isinstance(name, str) and name not in ("__main__", "builtins") and name not in names:
                names.append(name)
    return names


def _send(sock: socket.socket, msg: ZygoteReady | Forked | Refused | ChildExited) -> None:
    sock.send(pickle.dumps(msg))


def _preload(names: Iterable[str]) -> None:
    import importlib

    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
        install_tripwire()  # as soon as torch is in: a module below may ask torch.cuda
    with contextlib.suppress(Exception):
        import torch.compiler  # DDP's constructor imports the compiler stack: once, here

        torch.compiler.reset()


def serve(sock: socket.socket, preload: Iterable[str]) -> None:
    """The zygote's loop: preload, say ready, fork workers on request, report their exits.
    Returns when the driver closes its end."""
    install_tripwire()
    _preload(preload)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    children: set[int] = set()
    _send(sock, ZygoteReady(os.getpid(), cuda_touched()))
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _send(sock, ChildExited(pid, os.waitstatus_to_exitcode(status)))
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, BUF, 3)
        except ConnectionResetError:
            # The driver closed its end with our message unread: it dropped this zygote (a
            # fresh one whose preloads touched CUDA is replaced at once). As a close.
            data, fds = b"", []
        if not data:
            _reap_last(children)
            return
        request = pickle.loads(data)
        if not isinstance(request, ForkRequest):
            raise ProtocolError(f"the zygote takes ForkRequest, got {request!r}"[:300])
        why = cuda_touched() or (
            f"{threading.active_count() - 1} thread(s) run"
            if threading.active_count() > 1
            else None
        )
        if why:
            _send(sock, Refused(request.req, why))
        else:
            pid = os.fork()
            if pid == 0:
                fd_map = dict(zip(request.which, fds, strict=True))
                _worker(sock, (wake_r, wake_w), fd_map, request.env, request.cwd)
            children.add(pid)
            _send(sock, Forked(request.req, pid))
        for fd in fds:
            os.close(fd)


def _reap_last(children: set[int], wait_s: float = 5.0) -> None:
    """The driver is gone: its workers follow it within moments (they watch it); reap them,
    so that their exit (and their CPU time, for the driver's ``RUSAGE_CHILDREN``) ends here."""
    deadline = time.monotonic() + wait_s
    while children and time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            children.discard(pid)
        else:
            time.sleep(0.01)


def _worker(
    sock: socket.socket, pipe: tuple[int, int], fds: dict[int, int], env: dict[str, str], cwd: str
) -> None:
    """In the forked worker: the driver's stdio and cwd, a fresh CUDA state, then the loop."""
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        for fd in pipe:
            os.close(fd)
        for target, fd in fds.items():
            os.dup2(fd, target)
            os.close(fd)
        if cwd:
            os.chdir(cwd)
        why = cuda_touched()
        if why:  # the zygote checked before forking; never run a worker on a stale CUDA state
            raise RuntimeError(f"refusing to run a worker forked after CUDA was touched: {why}")
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # a fresh interpreter's seed, not the zygote's
        if env.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(line_buffering=True)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            os.write(2, f"torchjob zygote worker: {exc!r}\n".encode())
        os._exit(1)
    _child.run(env)  # never returns


def neutralize_fds(keep: set[int]) -> None:
    """A copy of the driver holds none of its sockets, pipes or files: the driver's peers must
    see them close when the driver closes them. Each is pointed at /dev/null (not closed: a
    Python object that owns the number may close it later)."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep and fd != null:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    os.close(null)


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sock, argv[1:])
    return 0
