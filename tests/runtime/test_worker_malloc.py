"""A trainer's worker processes fix glibc malloc's thresholds at their start
(torchjob.launch.malloc), whichever way they were started: a step's large temporaries are
then reused instead of faulted in again at every step; TORCHJOB_MALLOC_TUNING=0 keeps glibc's
defaults."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tests.malloc_cycles import PAGES, faults_per_cycle

import torchjob.train
from torchjob.train import RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def most_faults(_config: dict[str, object]) -> None:
    """Every rank runs the cycles; the most faults any rank took is reported."""
    faults = torch.tensor([faults_per_cycle()], dtype=torch.int64)
    dist.all_reduce(faults, op=dist.ReduceOp.MAX)
    torchjob.train.report({"faults": int(faults.item())})


def run(tmp_path: Path) -> int:
    result = TorchTrainer(
        most_faults,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="malloc", storage_path=str(tmp_path), progress=False),
    ).fit()
    assert result.metrics is not None
    return int(result.metrics["faults"])


def test_workers_reuse_a_steps_temporaries(tmp_path: Path) -> None:
    assert run(tmp_path / "tuned") < PAGES // 100


def test_tuning_off_keeps_glibcs_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHJOB_MALLOC_TUNING", "0")
    assert run(tmp_path / "default") > PAGES // 2
