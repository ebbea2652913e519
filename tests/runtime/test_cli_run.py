"""`torchjob run` through the installed console script: local pods form a real gloo group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]


def torchjob_cli() -> list[str]:
    script = Path(sys.executable).parent / "torchjob"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torchjob.cli.main"]


def test_allreduce_example_forms_a_process_group_from_the_env_contract() -> None:
    proc = subprocess.run(
        [*torchjob_cli(), "run", "-f", str(REPO / "examples" / "local" / "allreduce.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "[rank 0] rank 0/2: all_reduce sum 1 ok" in lines
    assert "[rank 1] rank 1/2: all_reduce sum 1 ok" in lines
    assert lines[-1] == "[torchjob] job allreduce succeeded"
