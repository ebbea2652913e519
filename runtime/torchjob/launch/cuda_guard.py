"""Never fork a process that touched CUDA: the checks behind ``torchjob.launch.zygote``.

``torch.cuda.is_initialized()`` is not enough: ``torch.cuda.is_available()`` and
``device_count()`` call ``cudaGetDeviceCount`` (``cuInit``) and fill c10's device-count cache
without initializing ``torch.cuda`` (pytorch issue 68861), and a child forked after that
fails at its first CUDA call, or sees the parent's devices. :func:`cuda_touched` looks at
every trace such a call leaves: ``torch.cuda``'s own flags and cache, the calls the
:func:`install_tripwire` wrapper counted, and the CUDA driver library mapped into the process
(whoever loaded it: torch, CuPy, JAX, NVML-free probes), and, last, whether torch poisoned
``fork`` (:func:`fork_poisoned`): an attempt to initialize ``torch.cuda`` that *failed* (no GPU:
``torch.cuda.current_device()``, ``_lazy_init()``) sets none of those flags, yet every child
forked afterwards is a "bad fork" that cannot use CUDA and that a zygote must refuse to be.

OpenMP is the other state a fork cannot copy: once a process ran a parallel region, GNU
OpenMP's thread pool exists, and a child forked afterwards hangs in its first parallel
region (the pool's threads are not copied, but the library believes they are there).
Importing torch does not start the pool; the first parallel op does (a model built in the
driver, a tensor op on more than 32768 elements). :func:`openmp_pool_started` asks a forked
child to run one.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

_TOUCHED: list[str] = []
"""What the tripwire saw: ``torch.cuda`` calls that fill the C++ device-count cache."""


def install_tripwire() -> None:
    """Record every later ``torch._C._cuda_getDeviceCount`` call in this process (what
    ``torch.cuda.is_available()`` and ``device_count()`` call): it runs ``cuInit`` and fills
    c10's device-count cache, which ``torch.cuda.is_initialized()`` does not show (pytorch
    issue 68861), so a child forked afterwards starts with a stale CUDA state."""
    torch = sys.modules.get("torch")
    c = getattr(torch, "_C", None)
    real = getattr(c, "_cuda_getDeviceCount", None)
    if real is None or getattr(real, "_torchjob_tripwire", False):
        return

    def counted() -> int:
        _TOUCHED.append("torch.cuda.is_available()/device_count() was called")
        return int(real())

    counted._torchjob_tripwire = True  # type: ignore[attr-defined]
    c._cuda_getDeviceCount = counted  # type: ignore[union-attr]


def libcuda_loaded(maps: str) -> bool:
    """Whether ``maps`` (a ``/proc/PID/maps`` text) maps the CUDA driver library."""
    return "/libcuda.so" in maps


def cuda_touched(*, probe_fork: bool = False) -> str | None:
    """Why this process must not be forked for a worker, or None: CUDA initialized (or this
    is a bad fork), the device count cached, a device-count call seen by the tripwire, the
    CUDA driver (``libcuda``) loaded into the process by anything at all, or (``probe_fork``:
    where a process is about to be copied, not on every request) fork poisoned by a failed
    CUDA initialization."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None:
        if getattr(cuda, "_initialized", False) or cuda.is_initialized():
            return "CUDA is initialized in this process"
        if getattr(cuda, "_is_in_bad_fork", lambda: False)():
            return "this process is a fork of one that initialized CUDA"
        if getattr(cuda, "_cached_device_count", None) is not None:
            return "torch.cuda cached the device count"
    if _TOUCHED:
        return _TOUCHED[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    if libcuda_loaded(maps):
        return "the CUDA driver (libcuda) is loaded in this process"
    if probe_fork and cuda is not None and fork_poisoned(cuda):
        return "torch tried to initialize CUDA in this process (a child would be a bad fork)"
    return None


def fork_poisoned(cuda: object) -> bool:
    """Whether a child forked now would be a "bad fork" for ``torch.cuda`` (torch's at-fork
    handler, installed by its first attempt to initialize CUDA, successful or not, marks the
    child). The mark shows only in a child, so ask one: it reads the flag and exits at once
    (65-215 ms on a loaded 2-core machine: only before a process is copied, where torch.cuda
    is imported and no other check already said so)."""
    in_bad_fork = getattr(cuda, "_is_in_bad_fork", None)
    if in_bad_fork is None or not hasattr(os, "fork"):
        return False
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return False
    if pid == 0:  # the child: only the flag, then out without any cleanup
        try:
            os.write(w, b"1" if in_bad_fork() else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        answer = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return answer == b"1"


OPENMP_PROBE_TIMEOUT_S = 2.0
"""How long the probe child may take for one parallel op (a few ms when it can run it)."""


def openmp_pool_started(timeout_s: float = OPENMP_PROBE_TIMEOUT_S) -> bool:
    """Whether torch's OpenMP pool already runs in this process, so that a child forked now
    would hang in its first parallel region. Asks one: a forked child runs a parallel op
    (131072 elements, four times torch's grain size) and exits; if it has not finished within
    ``timeout_s``, it is killed and the answer is yes (a child that was merely slow only
    costs the caller a fresh interpreter instead of a copy). No torch imported, one intra-op
    thread, or no ``fork``: no pool can be in the way (False)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(os, "fork"):
        return False
    try:
        if torch.get_num_threads() <= 1:
            return False
    except Exception:
        return True
    pid = os.fork()
    if pid == 0:  # the child: one parallel region, then out without any cleanup
        code = 1
        try:
            torch.ones(1 << 17).exp_()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.002)


def copyable(*, platform: str, touched: str | None, other_threads: int) -> str | None:
    """Why the driver cannot be copied into a zygote now, or None (pure)."""
    if not platform.startswith("linux"):
        return f"zygotes are only used on Linux, not {platform}"
    if touched:
        return f"the driver touched CUDA ({touched})"
    if other_threads:
        return f"the driver runs {other_threads} other thread(s)"
    return None
