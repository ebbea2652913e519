"""How a worker process starts: forked from the zygote, forked from the driver, or a fresh
interpreter.

A fresh interpreter (``python -m torchjob.launch._entry``) imports torch and whatever the
training function needs again, in every worker: seconds of CPU each (``import torch`` alone is
1-3 s), paid before the first step of every generation. Forking skips it, the way PyTorch's
DataLoader starts its workers: the child shares the imported modules and goes straight to the
worker loop. Forking is only safe from a process with no other thread (a lock another thread
holds at the fork stays held in the child) and that never touched CUDA
(``torchjob.launch.cuda_guard``), which a pod's driver (the ``MembershipWatch`` thread) or a
GPU driver is not. So the workers are forked from a **zygote** (``torchjob.launch.zygote``):
a process made before any of that, a copy of the driver or a fresh interpreter, that imported
torch once and forks each worker on request, GPU workers included (each initializes CUDA
itself, after the fork).

``TORCHJOB_WORKER_START`` (:func:`choose`): ``auto`` (the default) and ``zygote`` use the
zygote on Linux; ``fork`` forks each worker from the driver itself where that is safe (Linux,
no CUDA, no other thread, and once torch is imported one intra-op thread per worker: OpenMP's
pool does not survive a fork), as before the zygote; ``spawn``, and every platform but Linux,
start fresh interpreters. A zygote that is gone or refuses (it touched CUDA) falls back to
fresh interpreters, with a log line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Literal, Protocol

from torchjob.launch import _child, store_clients
from torchjob.launch.settings import ENV_WORKER_START, RuntimeSettings

StartMethod = Literal["zygote", "fork", "spawn"]

ENV_START = ENV_WORKER_START
"""``auto`` (unset) or ``zygote``: from the zygote; ``fork``: from the driver where safe;
``spawn``: fresh interpreters (``RuntimeSettings.worker_start``)."""


class ProcessHandle(Protocol):
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
    cuda_touched: bool,
    other_threads: int,
) -> tuple[StartMethod, str]:
    """How to start a worker with ``env``, and why (pure; the rules in the module docstring).
    ``zygote`` may still fall back to ``spawn`` when the zygote is unusable."""
    setting = RuntimeSettings.from_env(env).worker_start
    if setting == "spawn":
        return "spawn", f"{ENV_START}=spawn"
    if not platform.startswith("linux"):
        return "spawn", f"workers are only forked on Linux, not {platform}"
    if setting in ("auto", "zygote"):
        return "zygote", "forked from the zygote"
    if use_gpu or backend == "nccl" or env.get("CUDA_VISIBLE_DEVICES") != "":
        return "spawn", "GPU workers are not forked from the driver (CUDA state cannot be forked)"
    if cuda_touched:
        return "spawn", "the driver touched CUDA"
    if other_threads:
        return "spawn", f"the driver runs {other_threads} other thread(s)"
    if torch_imported and env.get("OMP_NUM_THREADS") != "1":
        return "spawn", "a forked worker runs one intra-op thread; OMP_NUM_THREADS asks for more"
    return "fork", "forked from the driver"


def current_choice(
    env: Mapping[str, str], *, use_gpu: bool, backend: str
) -> tuple[StartMethod, str]:
    """:func:`choose` for this process as it is now."""
    from torchjob.launch.cuda_guard import cuda_touched

    fork = RuntimeSettings.from_env(env).worker_start == "fork"
    return choose(
        env,
        platform=sys.platform,
        use_gpu=use_gpu,
        backend=backend,
        torch_imported="torch" in sys.modules,
        # the probe forks: only where the driver itself is about to be forked
        cuda_touched=cuda_touched(probe_fork=fork) is not None,
        other_threads=threading.active_count() - 1 + store_clients.serving(),
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
            _child.run(env)
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
