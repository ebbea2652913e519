"""The restore point's copy overlapped with the next step (``recovery.host_copy``): the
registered optimizers' tensors are copied on a thread that their ``step()`` waits for, and
everything else (buffers a forward changes, plain values) at once. The thread's copies are
held at a gate here, so that the loop reaches its next step while they are in flight."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchjob.train.recovery import host_copy, restore_point


@pytest.fixture
def gate(copy_gate: threading.Event) -> Iterator[threading.Event]:
    """``copy_gate`` (conftest), with nothing held before or after."""
    restore_point.drop()
    yield copy_gate
    copy_gate.set()
    restore_point.drop()
    host_copy.waited()


def _job() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)
    )
    return model, torch.optim.Adam(model.parameters(), lr=0.1), torch.randn(16, 8)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _copied(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in state.items()}


def test_the_next_step_waits_for_the_copy_and_buffers_are_copied_at_once(
    gate: threading.Event,
) -> None:
    """The restore point is the state at the report, although the next step began while its
    copy was in flight: the forward changed BatchNorm's statistics (copied at once) and the
    optimizer's step waited for the parameters and Adam's moments (copied on the thread)."""
    model, opt, x = _job()
    _step(model, opt, x)  # Adam's state exists
    registered = {"model": model, "opt": opt, "step": 1}
    at_report = _copied(model.state_dict())
    moment = opt.state_dict()["state"][0]["exp_avg"].clone()

    restore_point.take("run", 1, registered, [], overlap=True)
    assert host_copy._FLIGHT.thread is not None, "the optimizers' part is in flight"
    threading.Timer(0.2, gate.set).start()
    registered["step"] = 2
    _step(model, opt, x)  # its forward runs now; its opt.step() waits for the gate

    # It waited (any time: the forward before the wait may itself take most of the gate's
    # 0.2 s on a loaded machine; seen 0.066 s of wait under load), and could only finish
    # once the gate had let the copy end.
    assert host_copy.waited() > 0.0, "the step waited for the copy"
    assert gate.is_set()
    held = restore_point.held()
    assert held is not None and held.index == 1 and held.state["step"] == 1
    for name, value in at_report.items():
        assert torch.equal(held.state["model"][name], value), name
    assert torch.equal(held.state["opt"]["state"][0]["exp_avg"], moment)
    moved = model.state_dict()
    assert not torch.equal(moved["0.weight"], at_report["0.weight"]), "the step did train"
    assert not torch.equal(moved["1.running_mean"], at_report["1.running_mean"])


def test_without_overlap_or_without_an_optimizer_nothing_is_left_in_flight(
    gate: threading.Event,
) -> None:
    model, opt, x = _job()
    _step(model, opt, x)
    expected = _copied(model.state_dict())
    for registered, overlap in (({"model": model, "opt": opt}, False), ({"model": model}, True)):
        held = restore_point.take("run", 1, registered, [], overlap=overlap)
        assert host_copy._FLIGHT.thread is None
        assert held is not None
        for name, value in expected.items():
            assert torch.equal(held.state["model"][name], value), name


def test_a_copy_that_failed_on_its_thread_is_said_where_the_restore_point_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(dst: Any, src: Any) -> None:
        raise RuntimeError("no memory")

    monkeypatch.setattr(host_copy, "_copy_later", broken)
    model, opt, x = _job()
    _step(model, opt, x)
    restore_point.take("run", 1, {"model": model, "opt": opt}, [], overlap=True)
    with pytest.raises(RuntimeError, match="the restore point's copy failed: no memory"):
        restore_point.held()
    assert host_copy._FLIGHT.thread is None and not host_copy._FLIGHT.error
    restore_point.drop()


def test_owned_names_the_storages_of_parameters_and_optimizer_state_only() -> None:
    model, opt, x = _job()
    _step(model, opt, x)
    owned = host_copy.owned([opt])
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    moments = {
        v.untyped_storage().data_ptr()
        for per in opt.state.values()
        for v in per.values()
        if isinstance(v, torch.Tensor) and v.numel()
    }
    assert params | moments <= owned
    buffers = {b.untyped_storage().data_ptr() for b in model.buffers() if b.numel()}
    assert not buffers & owned


def test_the_copies_thread_says_the_cpu_it_spent_copying_once(gate: threading.Event) -> None:
    """``cpu_beside``: what the thread's copies of host tensors took of the CPU (beside a step
    on the CPU, the step's cores), said once: the next ask has nothing new."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)  # 4 MiB of weights, 8 MiB of Adam's moments
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    host_copy.cpu_beside()
    registered = {"model": model, "opt": opt}
    restore_point.take("run", 1, registered, [], overlap=True)  # allocates its buffers
    gate.set()
    host_copy.settle()
    restore_point.take("run", 2, registered, [], overlap=True)  # into them: a sample
    host_copy.settle()
    assert host_copy.cpu_beside() > 0.0
    assert host_copy.cpu_beside() == 0.0
