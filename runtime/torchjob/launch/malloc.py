"""glibc malloc's thresholds for a training process: fixed, so that a step's large temporaries
are reused instead of handed back to the kernel and faulted in again at the next step.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` (128 KiB at start) with its own
``mmap`` and, after a free, gives the heap's free top back to the kernel once it exceeds
``M_TRIM_THRESHOLD`` (twice the mmap threshold). Both move only up, and only when a freed
mmapped block is larger than the threshold; a training step that frees two or more tensors of
the largest size it allocates leaves a free top larger than the trim threshold, so every step
returns that memory and faults it in again, page by page, at the next (each page zeroed by the
kernel). Measured (docs/runtime.md, "Memory allocator"; bench/malloc_tuning.py): the
goodput workload's step over 256 MiB of Linear layers and Adam, in the runtime image (Debian's
torch 2.6, glibc 2.41), took 62,816 minor page faults and 198 ms; with the thresholds below,
none and 72 ms, for 64 MiB more peak resident memory.

A worker sets them at its start with ``mallopt`` (:func:`tune`), whatever started it (a fresh
interpreter, a fork of the driver or a zygote: glibc reads ``MALLOC_*`` variables only when a
process starts, so the environment alone would miss forked workers). It leaves malloc alone
where the user chose: ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or a
``GLIBC_TUNABLES`` malloc threshold set, another allocator preloaded (jemalloc, tcmalloc,
mimalloc), ``TORCHJOB_MALLOC_TUNING=0``, or a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
"""``mallopt`` parameters (glibc's ``malloc.h``)."""

MMAP_THRESHOLD: Final = 32 * 2**20
"""Blocks below this come from the heap (glibc's largest accepted value on 64-bit hosts)."""
TRIM_THRESHOLD: Final = 128 * 2**20
"""The free top the heap keeps before it gives memory back: above the 64 MiB glibc's own
dynamic threshold can reach, so a step whose temporaries free up to 128 MiB at once never
returns them (the memory stays resident between steps, as a GPU's caching allocator keeps
its blocks)."""

USER_VARIABLES: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
USER_TUNABLES: Final = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
OTHER_ALLOCATORS: Final = ("jemalloc", "tcmalloc", "mimalloc")


@dataclass(frozen=True)
class Plan:
    """The ``mallopt`` calls to make (none when ``reason`` says why not)."""

    calls: tuple[tuple[int, int], ...]
    reason: str


def choose(environ: Mapping[str, str], libc: str, *, enabled: bool = True) -> Plan:
    """What to set for a process with ``environ`` on C library ``libc`` (``platform.libc_ver``'s
    name): pure, so the choice is tested without a process."""
    if not enabled:
        return Plan((), "TORCHJOB_MALLOC_TUNING is off")
    if libc != "glibc":
        return Plan((), f"the C library is {libc or 'unknown'}, not glibc")
    chosen = [v for v in USER_VARIABLES if v in environ]
    tunables = environ.get("GLIBC_TUNABLES", "")
    chosen += [t for t in USER_TUNABLES if t in tunables]
    if chosen:
        return Plan((), f"{', '.join(chosen)} set by the user")
    preload = environ.get("LD_PRELOAD", "")
    other = [a for a in OTHER_ALLOCATORS if a in preload]
    if other:
        return Plan((), f"{other[0]} is preloaded")
    calls = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return Plan(
        calls, f"mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim {TRIM_THRESHOLD >> 20} MiB"
    )


def glibc_env() -> dict[str, str]:
    """The same thresholds as glibc's own variables, for processes torchjob does not start
    (torchrun's workers, a Kubeflow pod's): read when such a process starts."""
    return {
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
    }


def tune(environ: Mapping[str, str], *, enabled: bool = True) -> Plan:
    """Make :func:`choose`'s calls in this process; returns the plan (its reason says what was
    done). A call glibc refuses is logged and the rest stand."""
    chosen = choose(environ, platform.libc_ver()[0], enabled=enabled)
    if not chosen.calls:
        log.debug("malloc left as it is: %s", chosen.reason)
        return chosen
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    for param, value in chosen.calls:
        if mallopt(param, value) != 1:
            log.warning("glibc refused mallopt(%d, %d); malloc's default stays", param, value)
    return chosen
