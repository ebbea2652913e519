"""The model and optimizer of bench/goodput.py's workloads (bench/_goodput_worker.py and
bench/_goodput_torchrun.py), sized by ``--state-mib``.

0 (the default): ``Linear(16, 1)`` and SGD, as before issue 39: a state of a few bytes, whose
copy (a restore point, a checkpoint) costs nothing. N > 0: a stack of ``Linear(1024, 1024)``
layers with Adam, enough layers that the parameters and Adam's two moments (3 x the
parameters' bytes, float32) come to about N MiB; every step runs a 1-row input through every
layer and Adam updates every parameter, so the whole state is touched at each step and its
copies (the restore point's, a checkpoint's) are the size a real model's would be.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

WIDTH = 1024
LAYER_MIB = WIDTH * (WIDTH + 1) * 4 / 2**20
"""One layer's parameters, float32."""


def state_mib(argv: list[str] | None = None) -> int:
    """``--state-mib N`` from the command line (0 when absent)."""
    argv = sys.argv if argv is None else argv
    if "--state-mib" in argv:
        return int(argv[argv.index("--state-mib") + 1])
    return 0


def layers_for(mib: int) -> int:
    """Layers whose parameters and Adam moments come to about ``mib`` MiB (at least 1)."""
    return max(1, round(mib / (3 * LAYER_MIB)))


def build(mib: int, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model (not yet wrapped) and the input of every step."""
    if mib <= 0:
        return torch.nn.Linear(16, 1), torch.randn(batch, 16)
    layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers_for(mib))]
    # The input is one row: the step's cost is the state it touches, not its FLOPs
    # (``batch`` still counts the samples, as for the small model).
    return torch.nn.Sequential(*layers), torch.randn(1, WIDTH)


def optimizer(mib: int, params: Any) -> torch.optim.Optimizer:
    """SGD for the small model (as before), Adam (two moments per parameter) for a sized one."""
    if mib <= 0:
        return torch.optim.SGD(params, lr=0.01)
    return torch.optim.Adam(params, lr=1e-4)
