"""torchjob.launch.malloc: when a worker fixes glibc malloc's thresholds, and that a process
that does then stops faulting in a step's large temporaries again at every step."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from tests.malloc_cycles import PAGES

from torchjob.launch import malloc

REPO = str(Path(__file__).resolve().parents[2])
RUNTIME = os.path.join(REPO, "runtime")

TUNED = (
    (malloc.M_MMAP_THRESHOLD, malloc.MMAP_THRESHOLD),
    (malloc.M_TRIM_THRESHOLD, malloc.TRIM_THRESHOLD),
)


def test_glibc_without_a_user_choice_gets_both_thresholds() -> None:
    chosen = malloc.choose({"PATH": "/usr/bin"}, "glibc")
    assert chosen.calls == TUNED
    assert "32 MiB" in chosen.reason and "128 MiB" in chosen.reason


@pytest.mark.parametrize(
    ("environ", "libc", "enabled", "why"),
    [
        ({}, "glibc", False, "TORCHJOB_MALLOC_TUNING is off"),
        ({}, "", True, "unknown, not glibc"),
        ({}, "musl", True, "musl, not glibc"),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "glibc", True, "MALLOC_TRIM_THRESHOLD_ set"),
        ({"MALLOC_MMAP_THRESHOLD_": "1"}, "glibc", True, "MALLOC_MMAP_THRESHOLD_ set"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=1"},
            "glibc",
            True,
            "glibc.malloc.trim_threshold set",
        ),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "glibc", True, "jemalloc is preloaded"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "glibc", True, "tcmalloc is preloaded"),
    ],
)
def test_a_user_choice_or_another_libc_leaves_malloc_alone(
    environ: dict[str, str], libc: str, enabled: bool, why: str
) -> None:
    chosen = malloc.choose(environ, libc, enabled=enabled)
    assert chosen.calls == ()
    assert why in chosen.reason


def test_other_tunables_do_not_count_as_a_choice() -> None:
    assert malloc.choose({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc").calls == TUNED


# As a worker does at its start (torchjob.launch.worker), then the cycles.
CYCLES = (
    "import os; from torchjob.launch import malloc; "
    "from torchjob.launch.settings import RuntimeSettings; "
    "malloc.tune(os.environ, enabled=RuntimeSettings.from_env().malloc_tuning); "
    "from tests.malloc_cycles import faults_per_cycle; print(faults_per_cycle())"
)


def faults_per_cycle(**env: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CYCLES],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([RUNTIME, REPO]), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuned_process_reuses_its_temporaries_and_glibcs_default_faults_them_in() -> None:
    assert faults_per_cycle() < PAGES // 100
    assert faults_per_cycle(TORCHJOB_MALLOC_TUNING="0") > PAGES // 2
    # The user's own choice wins: glibc's variables, read at start, and no tuning on top.
    assert faults_per_cycle(MALLOC_TRIM_THRESHOLD_="1048576") > PAGES // 2
