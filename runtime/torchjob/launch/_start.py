"""How a worker process starts: a fresh interpreter, or a fork of the driver.

A fresh interpreter (``python -m torchjob.launch._entry``) imports torch and whatever the
training function needs again, in every worker: seconds of CPU each (``import torch`` alone is
1-3 s), paid before the first step of every generation. The driver has usually imported all of
it already (the user's script imports torch at its top), so on Linux a worker is forked from
the driver when that is safe, the way PyTorch's DataLoader starts its workers: the child shares
the driver's imported modules and goes straight to the worker loop.

Safe means (:func:`choose`): Linux; no CUDA (a driver that initialized CUDA cannot fork, and
torch caches the visible device count, which differs per worker); no other Python thread in the
driver (a lock another thread holds at the fork stays held in the child); and, once torch is
imported, one intra-op thread per worker (OpenMP's thread pool does not survive a fork: like
DataLoader workers, a forked worker runs with one thread, which is torchrun's default too
when several workers share a host). Otherwise, or with ``TORCHJOB_WORKER_START=spawn``, the
worker is a fresh interpreter, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Literal, Protocol

StartMethod = Literal["fork", "spawn"]

ENV_START = "TORCHJOB_WORKER_START"
"""``spawn`` forces fresh interpreters; ``fork`` or unset: fork where :func:`choose` allows."""


class WorkerProcess(Protocol):
    """What the group uses of a worker process (``subprocess.Popen`` has it)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def choose(
    env: Mapping[str, str],
    *,
    platform: str,
    use_gpu: bool,
    backend: str,
    torch_imported: bool,
    cuda_initialized: bool,
    other_threads: int,
) -> tuple[StartMethod, str]:
    """How to start a worker with ``env``, and why (pure; the rules in the module docstring)."""
    if env.get(ENV_START) == "spawn":
        return "spawn", f"{ENV_START}=spawn"
    if not platform.startswith("linux"):
        return "spawn", f"fork is only used on Linux, not {platform}"
    if use_gpu or backend == "nccl" or env.get("CUDA_VISIBLE_DEVICES") != "":
        return "spawn", "GPU workers start fresh (CUDA state cannot be forked)"
    if cuda_initialized:
        return "spawn", "the driver initialized CUDA"
    if other_threads:
        return "spawn", f"the driver runs {other_threads} other thread(s)"
    if torch_imported and env.get("OMP_NUM_THREADS") != "1":
        return "spawn", "a forked worker runs one intra-op thread; OMP_NUM_THREADS asks for more"
    return "fork", "forked from the driver"


def current_choice(
    env: Mapping[str, str], *, use_gpu: bool, backend: str
) -> tuple[StartMethod, str]:
    """:func:`choose` for this process as it is now."""
    torch = sys.modules.get("torch")
    cuda_initialized = False
    if torch is not None:
        cuda = getattr(torch, "cuda", None)
        cuda_initialized = bool(cuda is not None and cuda.is_initialized())
    return choose(
        env,
        platform=sys.platform,
        use_gpu=use_gpu,
        backend=backend,
        torch_imported=torch is not None,
        cuda_initialized=cuda_initialized,
        other_threads=threading.active_count() - 1,
    )


def spawn(env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A fresh interpreter running the worker loop."""
    return subprocess.Popen(
        [sys.executable, "-m", "torchjob.launch._entry"],
        env=dict(env),
        start_new_session=True,  # terminal Ctrl-C goes to the driver only
    )


def preload() -> None:
    """Import, once in the driver, what every worker imports at its first step: DDP's
    constructor imports ``torch._dynamo`` (about 900 modules, seconds of CPU in every worker,
    and in a replacement before it can join), so that forked workers share it. Only where
    the driver imported torch already (it starts no thread and does not touch CUDA)."""
    if "torch" in sys.modules and "torch._dynamo" not in sys.modules:
        import torch.compiler

        torch.compiler.disable(preload)  # type: ignore[no-untyped-call]  # imports it, no side effect


class ForkedProcess:
    """A worker forked from the driver, with the part of ``Popen``'s interface the group uses:
    ``returncode`` is the exit status, or ``-N`` for a worker killed by signal ``N``."""

    def __init__(self, env: Mapping[str, str]) -> None:
        preload()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the driver's code
            _child(env)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code


def _child(env: Mapping[str, str]) -> None:
    code = 1
    try:
        os.setsid()  # terminal Ctrl-C goes to the driver only; the group kills the session
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.environ.clear()
        os.environ.update(env)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
        from torchjob.launch.worker import main

        code = main()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # skip the driver's atexit handlers and interpreter teardown
