"""The in-memory restore point of a state on a GPU (``torchjob.train.recovery.device_copy``):
page-locked host memory, copies on a side stream that the next step's forward runs beside,
and an optimizer step that waits for them. Skipped without a CUDA GPU.

    python -m pytest tests/gpu/test_restore_point_cuda.py -m gpu -v
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.gpu_marks import NEEDS_GPU
from torch import nn

from torchjob.train.recovery import restore_point

pytestmark = NEEDS_GPU


@pytest.fixture(autouse=True)
def _no_restore_point_held() -> Iterator[None]:
    restore_point.drop()
    yield
    restore_point.drop()


def _job(layers: int = 8, rows: int = 2048) -> tuple[dict[str, Any], Any]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(layers)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(rows, 1024, device="cuda")

    def step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # Adam's moments exist
    return {"model": model, "opt": opt, "step": 1}, step


def _cpu(tree: Any) -> Any:
    """A plain synchronous CPU copy: what the restore point must equal."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_cpu(v) for v in tree)
    return tree


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def _equal(a: Any, b: Any) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return False
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(ta, tb, strict=True))


@pytest.mark.parametrize("overlap", [True, False])
def test_the_restore_point_of_gpu_state_is_pinned_and_holds_the_report_s_state(
    overlap: bool,
) -> None:
    registered, step = _job()
    at_report = _cpu(restore_point.state_of(registered))
    snap = restore_point.take("run", 1, registered, [], overlap=overlap)
    assert snap is not None and snap.arena is not None and snap.arena.pinned
    assert all(t.is_pinned() for t in _tensors(snap.state)), "one page-locked block"
    step()  # its forward runs beside the copies; its optimizer step waits for them
    held = restore_point.held()
    assert held is snap
    assert _equal(held.state, at_report), "the copy holds the report's state, not the next step's"
    assert not _equal(restore_point.state_of(registered), at_report), "the step did change it"

    # The next restore point writes over the same pinned block.
    at_second = _cpu(restore_point.state_of(registered))
    again = restore_point.take("run", 2, registered, [], overlap=overlap)
    assert again is not None and not again.allocated and again.arena is snap.arena
    step()
    assert _equal(restore_point.held().state, at_second)  # type: ignore[union-attr]


def test_a_restore_point_loads_back_onto_the_gpu() -> None:
    registered, step = _job()
    at_report = _cpu(restore_point.state_of(registered))
    snap = restore_point.take("run", 1, registered, [], overlap=True)
    for _ in range(3):
        step()
    restore_point.load_into(registered, restore_point.held().state)  # type: ignore[union-attr]
    live = restore_point.state_of(registered)
    assert _equal(live, at_report)
    assert all(t.is_cuda for t in _tensors(live["model"])), "loaded in place, on the GPU"
    assert snap.arena is not None and snap.arena.pinned
