"""tests/cpu_profile.py's readings: /proc/stat, and cpuacct counters that come and go."""

from __future__ import annotations

import time
from pathlib import Path

from tests.cpu_profile import busy_seconds, cgroup_seconds, spent


def test_busy_seconds_grow_while_this_process_burns_cpu() -> None:
    before = busy_seconds()
    assert before > 0
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of this process's own CPU time
        pass
    assert busy_seconds() - before >= 0.2  # /proc/stat counts in 10 ms ticks


def test_a_cgroup_that_appears_counts_from_zero_and_one_that_goes_is_left_out(
    tmp_path: Path,
) -> None:
    session, node, gone = tmp_path / "session", tmp_path / "node", tmp_path / "gone"
    for d in (session, gone):
        d.mkdir()
    (session / "cpuacct.usage").write_text("1000000000\n")
    (gone / "cpuacct.usage").write_text("5000000000\n")
    before = cgroup_seconds([session, node, gone])
    assert before == {session: 1.0, gone: 5.0}  # the node's cgroup does not exist yet
    (session / "cpuacct.usage").write_text("3500000000\n")
    node.mkdir()
    (node / "cpuacct.usage").write_text("2000000000\n")
    (gone / "cpuacct.usage").unlink()
    gone.rmdir()
    used = spent(before, cgroup_seconds([session, node, gone]))
    assert used == {session: 2.5, node: 2.0}


def test_a_malformed_counter_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "cpuacct.usage").write_text("not a number\n")
    assert cgroup_seconds([tmp_path]) == {}
