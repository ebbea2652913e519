"""CPU-seconds per test, for finding what makes the suite slow.

Opt-in: ``.venv/bin/python -m pytest -p tests.cpu_profile tests/cluster ...``. Alone on an
otherwise idle machine it reads ``/proc/stat``, so it counts every process (control planes,
real nodes, containers, workers), not only this session's.

Inside ``make test`` (hack/test.sh loads it in every session where cgroup v1's cpuacct is
mounted alone) it reads counters instead, so that five sessions side by side are told apart:
``TORCHJOB_CPU_PROFILE_CGROUPS`` names cpuacct cgroup directories, separated by ``:``; the
first is the session's own (pytest, its control plane, operators and kubelets), the others
the cgroups of its real nodes' containers (hack/node.sh: ``/torchjob-<cluster>``), which may
come and go with the nodes: a counter is read where it exists at both ends of a test, and one
that appears during a test counts from zero.

At the end it prints the CPU-seconds and wall seconds by file and the hungriest tests (setup
and teardown included, so a session fixture's cost lands on the first test that needs it),
``TORCHJOB_CPU_PROFILE_TOP`` of them (default 25). docs/development.md ("where the warm CI's
time goes") has what it found.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_CPU: Counter[str] = Counter()
_WALL: Counter[str] = Counter()
_CONTAINERS: Counter[str] = Counter()
_TESTS: dict[str, tuple[float, float]] = {}


def busy_seconds() -> float:
    """CPU-seconds the machine has spent busy since boot (all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / 100.0


def cgroup_seconds(dirs: list[Path]) -> dict[Path, float]:
    """CPU-seconds each cpuacct cgroup in ``dirs`` has used; a cgroup that does not exist
    (a real node not started yet, or already gone) is left out."""
    out: dict[Path, float] = {}
    for d in dirs:
        try:
            out[d] = int((d / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            continue
    return out


def spent(before: dict[Path, float], after: dict[Path, float]) -> dict[Path, float]:
    """What each cgroup used between two readings. One that appeared in between counts from
    zero (it was made during the test); one that went away is not known, and left out."""
    return {d: t - before.get(d, 0.0) for d, t in after.items()}


def _cgroups() -> list[Path]:
    raw = os.environ.get("TORCHJOB_CPU_PROFILE_CGROUPS", "")
    return [Path(p) for p in raw.split(":") if p]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    dirs = _cgroups()
    wall = time.monotonic()
    if dirs:
        before = cgroup_seconds(dirs)
    else:
        cpu = busy_seconds()
    yield
    wall = time.monotonic() - wall
    path = item.nodeid.split("::")[0]
    if dirs:
        used = spent(before, cgroup_seconds(dirs))
        cpu = sum(used.values())
        _CONTAINERS[path] += sum(t for d, t in used.items() if d != dirs[0])
    else:
        cpu = busy_seconds() - cpu
    _CPU[path] += cpu
    _WALL[path] += wall
    _TESTS[item.nodeid] = (cpu, wall)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    top = int(os.environ.get("TORCHJOB_CPU_PROFILE_TOP", "25"))
    where = "this session's cgroups" if _cgroups() else "the whole machine's CPU"
    write(f"CPU-s    wall-s  (real-node containers' CPU-s)  by file ({where} while it ran)")
    for path, cpu in _CPU.most_common():
        write(f"{cpu:7.1f} {_WALL[path]:7.1f}  ({_CONTAINERS[path]:6.1f})  {path}")
    write(f"CPU-s    wall-s  the {top} hungriest tests")
    for nodeid, (cpu, wall) in sorted(_TESTS.items(), key=lambda kv: -kv[1][0])[:top]:
        write(f"{cpu:7.1f} {wall:7.1f}  {nodeid}")
