"""``torchjob_operator.engine.memory``: freed heap goes back to the kernel (on glibc)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from torchjob_operator.engine import memory


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(memory._libc() is None, reason="not glibc: nothing to trim")
def test_memory_freed_by_other_threads_goes_back_to_the_kernel() -> None:
    held: list[list[bytes]] = []

    def grow() -> None:  # 2 KiB blocks: malloc's, not pymalloc's
        held.append([bytes(2048) + bytes([i % 256]) for i in range(40_000)])

    threads = [threading.Thread(target=grow) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    grown = _rss_mib()
    # Free all but every 50th block: what stays keeps glibc from shrinking its heaps alone.
    kept = [b for blocks in held for b in blocks[::50]]
    held.clear()
    after_free = _rss_mib()
    assert memory.release_freed()
    trimmed = _rss_mib()
    assert len(kept) == 4 * 800
    assert after_free > grown - 100, "glibc keeps the freed pages by itself"
    assert trimmed < after_free - 200, (grown, after_free, trimmed)
