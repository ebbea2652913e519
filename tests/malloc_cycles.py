"""A step's large temporaries, in C: three 24 MiB blocks written and freed per cycle. glibc's
own thresholds (at most 32 MiB mmap and 64 MiB trim, whatever the process freed before) hand
the 72 MiB back to the kernel and fault it in again every cycle; torchjob.launch.malloc's
keep it. Used by tests/unit/test_malloc.py (a bare process) and
tests/runtime/test_worker_malloc.py (a trainer's workers)."""

from __future__ import annotations

import ctypes
import os
import resource

BLOCK = 24 << 20
BLOCKS = 3
PAGES = BLOCKS * BLOCK // os.sysconf("SC_PAGE_SIZE")
"""The pages one cycle writes: what it faults in when glibc gave them back."""


def faults_per_cycle(cycles: int = 5) -> int:
    """Minor page faults per cycle in this process, after one cycle to warm up."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    def cycle() -> None:
        blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
        for b in blocks:
            libc.memset(b, 1, BLOCK)
        for b in blocks:
            libc.free(b)

    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cycles):
        cycle()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // cycles
