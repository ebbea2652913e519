"""CPU-seconds of the whole machine per test, for finding what makes the suite slow.

Opt-in: ``.venv/bin/python -m pytest -p tests.cpu_profile tests/cluster ...``. Run it alone on
an otherwise idle machine: it reads ``/proc/stat``, so it counts every process (control
planes, real nodes, containers, workers), not only this session's. At the end it prints the
CPU-seconds and wall seconds by file and the 25 hungriest tests (setup and teardown included,
so a session fixture's cost lands on the first test that needs it). docs/development.md
("where the warm CI's time goes") has what it found.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

_CPU: Counter[str] = Counter()
_WALL: Counter[str] = Counter()
_TESTS: dict[str, tuple[float, float]] = {}


def busy_seconds() -> float:
    """CPU-seconds the machine has spent busy since boot (all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / 100.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = busy_seconds(), time.monotonic()
    yield
    cpu, wall = busy_seconds() - cpu, time.monotonic() - wall
    path = item.nodeid.split("::")[0]
    _CPU[path] += cpu
    _WALL[path] += wall
    _TESTS[item.nodeid] = (cpu, wall)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    write("CPU-s    wall-s  by file (the whole machine's CPU while the file's tests ran)")
    for path, cpu in _CPU.most_common():
        write(f"{cpu:7.1f} {_WALL[path]:7.1f}  {path}")
    write("CPU-s    wall-s  the 25 hungriest tests")
    for nodeid, (cpu, wall) in sorted(_TESTS.items(), key=lambda kv: -kv[1][0])[:25]:
        write(f"{cpu:7.1f} {wall:7.1f}  {nodeid}")
