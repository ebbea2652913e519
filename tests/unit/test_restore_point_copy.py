"""The in-memory restore point's copy and load, in one process (``torchjob.train.recovery.restore_point``).

The multi-process behaviour (a lost rank, the agreement, the broadcast) is
tests/runtime/test_restore_point.py; here: a report's copy reuses the previous one's
buffers and is a copy (later steps do not change it), it loads back into the live objects
and plain values, and a ``TrainState`` round-trips through it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchjob.train.recovery import restore_point


def _model_and_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    opt.step()


def test_a_report_copies_the_state_into_reused_buffers_and_it_loads_back() -> None:
    restore_point.drop()
    model, opt = _model_and_opt()
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 1}
    first = restore_point.take("run", 1, state, [])
    weight = first.state["model"]["weight"]
    assert first.nbytes > 0 and weight.data_ptr() != model.weight.data_ptr()
    _step(model, opt)
    state["step"] = 2
    second = restore_point.take("run", 2, state, [])
    assert second.state["model"]["weight"] is weight, "the buffers are reused"
    held = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    _step(model, opt)  # the live state moves on; the restore point does not
    state["step"] = 3
    assert not torch.equal(model.weight, held["weight"])
    restore_point.load_into(state, second.state)
    assert state["step"] == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, held[k])
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert restore_point.held() is second


def test_another_run_or_other_keys_are_refused() -> None:
    restore_point.drop()
    model, opt = _model_and_opt()
    snap = restore_point.take("run-a", 1, {"model": model}, [])
    with pytest.raises(KeyError, match="no entry 'optimizer'"):
        restore_point.load_into({"model": model, "optimizer": opt}, snap.state)
    other = restore_point.take("run-b", 1, {"model": model}, [])
    assert other.state["model"]["weight"] is not snap.state["model"]["weight"]


def test_a_train_state_round_trips() -> None:
    from torchjob.train import TrainState

    restore_point.drop()
    model, opt = _model_and_opt()
    ts = TrainState(model, opt, step=5)
    registered = {"state": ts}
    snap = restore_point.take("run", 5, registered, [])
    held = model.weight.detach().clone()
    _step(model, opt)
    ts.step = 6
    restore_point.load_into(registered, snap.state)
    assert ts.step == 5 and torch.equal(model.weight, held)


class _Shard(torch.Tensor):
    """Stands in for a DTensor (an FSDP2 shard): a tensor subclass."""


def test_sharded_state_is_not_held() -> None:
    # A rank's FSDP2 shard could not be given back to another rank: no restore point, the
    # run resumes from storage (docs/runtime.md, Known limits).
    restore_point.drop()
    model, _ = _model_and_opt()
    assert restore_point.take("run", 1, {"model": model}, []) is not None
    shard = torch.randn(2).as_subclass(_Shard)
    assert restore_point.take("run", 2, {"model": model, "shard": shard}, []) is None
    assert restore_point.held() is None


def test_the_loaded_state_does_not_share_memory_with_the_restore_point() -> None:
    # Optimizer.load_state_dict keeps the tensors it is given: without copies, the steps
    # after a restore would move the held restore point's optimizer state with them.
    restore_point.drop()
    model, opt = _model_and_opt()
    state: dict[str, Any] = {"model": model, "optimizer": opt, "extra": torch.zeros(2)}
    snap = restore_point.take("run", 1, state, [])
    assert snap is not None
    held = snap.state["optimizer"]["state"][0]["momentum_buffer"].clone()
    restore_point.load_into(state, snap.state)
    _step(model, opt)
    state["extra"].add_(1)
    assert torch.equal(snap.state["optimizer"]["state"][0]["momentum_buffer"], held)
    assert torch.equal(snap.state["extra"], torch.zeros(2))


def test_a_first_copy_is_one_block_that_a_broadcast_sends_as_it_is() -> None:
    """A process's first restore point goes into one block of its memory (page-locked where
    the state is on a GPU: tests/gpu/test_restore_point_cuda.py); the next copies write over
    it, and a grow's broadcast sends that block without packing the tensors again."""
    restore_point.drop()
    model, opt = _model_and_opt()
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 1}
    first = restore_point.take("run", 1, state, [])
    assert first is not None and first.allocated
    arena = first.arena
    assert arena is not None and arena.path is None and not arena.pinned, "no GPU: not pinned"
    assert all(
        arena.owns(t) for t in (first.state["model"]["weight"], first.state["model"]["bias"])
    )
    _step(model, opt)
    second = restore_point.take("run", 2, state, [])
    assert second is not None and not second.allocated and second.arena is arena
    _header, body = restore_point._encode(second)
    assert body.untyped_storage().data_ptr() == arena.data.untyped_storage().data_ptr()
    decoded = restore_point._decode(_header, body.clone())
    for k, v in model.state_dict().items():
        assert torch.equal(decoded.state["model"][k], v), k
