"""Giving memory back when jobs go: glibc's malloc arenas, bounded and trimmed.

A burst of jobs grows the heap (pod bodies, JSON, the Kubernetes client's buffers) from
the operator's many threads, and glibc gives each thread that contends for the heap an
arena of its own (up to 8 per core), each keeping what it freed for later. After the jobs
are deleted the objects are gone but the pages stay mapped: RSS stayed 12 to 19 % above
idle (bench/README.md). Two standard remedies, both no-ops where the C library is not glibc:

- ``limit_arenas``: at most ``ARENAS`` arenas (``mallopt(M_ARENA_MAX)``, what
  ``MALLOC_ARENA_MAX=2`` does for gunicorn and the JVM), called before the threads start;
- ``release_freed``: ``gc.collect()`` then ``malloc_trim(0)``, which returns the free
  pages of every arena to the kernel; ``TrimLater`` calls it a few seconds after jobs
  were deleted, so a burst of deletions costs one trim.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import signal
import tracemalloc
from collections.abc import Callable
from functools import cache
from types import FrameType

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8  # from glibc's malloc.h


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018  (glibc only: musl has no malloc_trim)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Bound glibc's malloc arenas; True when it applied."""
    libc = _libc()
    return bool(libc and libc.mallopt(_M_ARENA_MAX, arenas) == 1)


def release_freed() -> bool:
    """Collect garbage, then hand every free page of the heap back to the kernel."""
    gc.collect()
    libc = _libc()
    if libc is None:
        return False
    released = bool(libc.malloc_trim(0))
    log.debug("malloc_trim: %s", "released memory" if released else "nothing to release")
    return released


def trace_allocations(frames: int = 1) -> None:
    """Debugging what holds memory (``TORCHJOB_TRACEMALLOC=<frames>``): trace every
    allocation, and on SIGUSR1 log the 25 places holding the most (``kill -USR1 <pid>``)."""
    tracemalloc.start(max(frames, 1))

    def dump(_signum: int, _frame: FrameType | None) -> None:
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        current, peak = tracemalloc.get_traced_memory()
        lines = [f"tracemalloc: {current / 2**20:.1f} MiB traced (peak {peak / 2**20:.1f})"]
        for stat in snapshot.statistics("traceback" if frames > 1 else "lineno")[:25]:
            where = " <- ".join(str(f) for f in stat.traceback[:frames])
            lines.append(f"  {stat.size / 2**10:9.0f} KiB {stat.count:8d} blocks  {where}")
        log.warning("\n".join(lines))

    signal.signal(signal.SIGUSR1, dump)


class TrimLater:
    """One trim per burst: every ``soon()`` (on the event loop) moves the trim to ``delay_s``
    from now; when it runs (in a thread), an ``idle()`` operator also gives back what it
    keeps only for work (``release_idle``: the write pool's threads, kept-alive
    connections), which the next object makes again."""

    def __init__(
        self, delay_s: float, *, idle: Callable[[], bool], release_idle: Callable[[], None]
    ) -> None:
        self.delay_s = delay_s
        self.idle = idle
        self.release_idle = release_idle
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Future[bool] | None = None

    def soon(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._start)

    def _start(self) -> None:
        self._timer = None
        idle = self.idle()
        # Held until done: the event loop keeps only a weak reference to a task.
        self._task = asyncio.ensure_future(asyncio.to_thread(self._release, idle))

    def _release(self, idle: bool) -> bool:
        if idle:
            self.release_idle()
        return release_freed()
