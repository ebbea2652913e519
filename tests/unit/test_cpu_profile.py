"""tests/cpu_profile.py's reading of /proc/stat."""

from __future__ import annotations

import time

from tests.cpu_profile import busy_seconds


def test_busy_seconds_grow_while_this_process_burns_cpu() -> None:
    before = busy_seconds()
    assert before > 0
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of this process's own CPU time
        pass
    assert busy_seconds() - before >= 0.2  # /proc/stat counts in 10 ms ticks
