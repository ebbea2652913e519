"""``recovery.step_undo``: the step a loss broke does nothing, and what else it moved goes
back to the last report, so the live state is that report's exactly (one process, no group:
``broken`` is a flag here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchjob.train.recovery import step_undo


class Broken:
    """The in-place mark, as ``in_place.broken`` reads it."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __call__(self) -> BaseException | None:
        return self.error


def setup(opt_cls: Any = torch.optim.Adam) -> tuple[dict[str, Any], Broken]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = opt_cls(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    registered: dict[str, Any] = {"model": model, "opt": opt, "sched": sched, "step": 0}
    broken = Broken()
    step_undo.forget()
    step_undo.watch(registered, broken)
    return registered, broken


def one_step(registered: dict[str, Any]) -> None:
    model, opt = registered["model"], registered["opt"]
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    registered["sched"].step()
    registered["step"] += 1


def state(registered: dict[str, Any]) -> dict[str, Any]:
    import copy

    return {
        "model": copy.deepcopy(registered["model"].state_dict()),
        "opt": copy.deepcopy(registered["opt"].state_dict()),
        "sched": copy.deepcopy(registered["sched"].state_dict()),
        "step": registered["step"],
        "rng": torch.get_rng_state(),
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name
    assert a["opt"]["param_groups"] == b["opt"]["param_groups"]
    for i, per in a["opt"]["state"].items():
        for k, v in per.items():
            assert torch.equal(v, b["opt"]["state"][i][k]), (i, k)
    assert a["sched"] == b["sched"]
    assert a["step"] == b["step"]
    assert torch.equal(a["rng"], b["rng"])


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.SGD, torch.optim.AdamW])
def test_the_step_after_the_loss_is_undone_to_the_report(opt_cls: Any) -> None:
    registered, broken = setup(opt_cls)
    one_step(registered)
    step_undo.mark("run", 1, registered)
    at_report = state(registered)
    broken.error = RuntimeError("peer lost")
    one_step(registered)  # forward (batch norm statistics), no update, scheduler, counter
    assert registered["step"] == 2
    assert all(p.grad is None for p in registered["model"].parameters())
    assert step_undo.undoable("run", 1)
    assert step_undo.undo("run", 1, registered)
    assert_same(state(registered), at_report)


def test_a_step_that_went_through_since_the_report_is_not_undone() -> None:
    """A loop that reports every few steps: a step applied after the report moved the
    parameters, which the light copy does not hold: the group rolls back instead."""
    registered, broken = setup()
    step_undo.mark("run", 1, registered)
    one_step(registered)
    broken.error = RuntimeError("peer lost")
    one_step(registered)
    assert not step_undo.undoable("run", 1)
    assert not step_undo.undo("run", 1, registered)


def test_nothing_to_undo_without_a_step_another_report_or_run() -> None:
    registered, broken = setup()
    step_undo.mark("run", 3, registered)
    broken.error = RuntimeError("peer lost")
    assert not step_undo.undoable("run", 3), "the loop took no step since the report"
    one_step(registered)
    assert not step_undo.undoable("run", 2), "another report"
    assert not step_undo.undoable("other", 3), "another run"
    assert step_undo.undoable("run", 3)
    step_undo.forget()
    assert not step_undo.undoable("run", 3), "a new group forgets it"


def test_an_unbroken_step_moves_the_parameters() -> None:
    registered, _ = setup()
    before = [p.detach().clone() for p in registered["model"].parameters()]
    one_step(registered)
    after = list(registered["model"].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_watch_hooks_an_optimizer_once() -> None:
    registered, broken = setup()
    step_undo.watch(registered, broken)  # again: no second hook
    step_undo.mark("run", 1, registered)
    one_step(registered)
    broken.error = RuntimeError("peer lost")
    one_step(registered)
    assert step_undo._STEPS.applied == 1 and step_undo._STEPS.voided == 1
