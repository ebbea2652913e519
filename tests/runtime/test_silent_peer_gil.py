"""A rank that holds its GIL is not a silent peer (torchjob.launch.driver_beat).

Real gloo workers on this machine, ``TORCHJOB_SILENT_PEER_S=2``: rank 1 holds its
interpreter's GIL for three times that long (a C call made through ``ctypes.PyDLL``, which
keeps the GIL, as a slow import or a large pickle would), so its own heartbeat thread
stops. Its driver beats for it from its own process (the worker process runs and is not
stopped), so nobody declares it silent: the run ends in its first generation, no rank was
killed. (tests/runtime/test_restore_point.py's SIGSTOP case is the other side: a stopped
process gets no beat from its driver and is found silent.)
"""

from __future__ import annotations

import ctypes

import pytest

import torchjob.train
from torchjob.train import FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer

SILENT_S = 2.0


def loop(config: dict[str, float]) -> None:
    import torch.distributed as dist

    ctx = torchjob.train.get_context()
    for step in range(3):
        if step == 1 and ctx.get_world_rank() == 1:
            ctypes.PyDLL(None).sleep(int(3 * SILENT_S))  # libc sleep(), the GIL held
        dist.barrier()
        torchjob.train.report({"step": step, "generation": ctx.get_generation()})


def test_a_rank_holding_its_gil_is_not_found_silent(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHJOB_SILENT_PEER_S", str(SILENT_S))
    result = TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="gil",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=0),
        ),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    ).fit()
    assert result.error is None
    assert [m["generation"] for m in result.metrics_history] == [0, 0, 0], "never re-formed"
