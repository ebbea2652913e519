"""The one RNG capture (``torchjob.checkpoint.rng``): python, numpy and torch come back as they
were, and CUDA states saved on a host with more GPUs are trimmed to this host's devices."""

from __future__ import annotations

import random
from typing import Any

import numpy
import pytest
import torch

from torchjob.checkpoint import capture_rng, restore_rng


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(numpy.random.rand()), torch.rand(3).tolist()


def test_python_numpy_and_torch_draw_the_same_after_a_restore() -> None:
    states = capture_rng()
    assert {"python", "numpy", "torch"} <= set(states)
    first = _draw()
    restore_rng(states)
    assert _draw() == first


def test_cuda_states_of_a_bigger_host_are_trimmed_to_this_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got: list[Any] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", got.extend)
    restore_rng({"cuda": ["gpu0", "gpu1", "gpu2", "gpu3"]})
    assert got == ["gpu0", "gpu1"]
