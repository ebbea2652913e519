"""Which GPUs a worker group's processes see; runs everywhere (torch.cuda is faked where needed).

``use_gpu=True``: one GPU per local worker, so more workers than visible GPUs is a
configuration error, raised before anything starts. ``use_gpu=False``: like Ray, the
workers see no GPU (``CUDA_VISIBLE_DEVICES=""``), so code that picks ``cuda`` when
available stays on the CPU its model is on. The same checks on a real GPU are in
``test_cuda.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

from torchjob.launch import WorkerGroup


def test_more_gpu_workers_than_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"2 workers on this host, but 1 GPU\(s\) visible"):
        WorkerGroup(2, use_gpu=True)
    assert WorkerGroup(1, use_gpu=True).backend == "nccl"  # constructing starts nothing


def test_use_gpu_without_cuda_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert WorkerGroup(3, use_gpu=True).backend == "gloo"


def _visible() -> tuple[str | None, bool]:
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()


def test_cpu_workers_see_no_gpu() -> None:
    with WorkerGroup(1, use_gpu=False, timeout_s=60) as group:
        assert group.backend == "gloo"
        assert group.execute(_visible) == [("", False)]
    # An explicit choice in env= wins.
    with WorkerGroup(1, use_gpu=False, timeout_s=60, env={"CUDA_VISIBLE_DEVICES": "7"}) as group:
        assert group.execute(_visible)[0][0] == "7"
