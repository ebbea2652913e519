"""The marks of every test under tests/gpu: selected by ``-m gpu``, and skipped where torch
sees no CUDA GPU (CI, laptops), so ``make test`` reports them as skipped."""

from __future__ import annotations

import pytest
import torch

NEEDS_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
    ),
]
