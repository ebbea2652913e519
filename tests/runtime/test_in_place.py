"""Re-forming in place (``register_state(state, in_place=True)``, ``recovery.in_place``).

Real gloo workers on this machine; one rank SIGKILLs itself in generation 0, either before
its backward (the survivors' DDP all-reduce meets the loss: the comm hook marks the group
broken) or after its optimizer step (the survivors' ``should_stop()`` all-reduce meets it).

* A shrink (``num_workers=(2, 3)``): the survivors go on inside the training function, which
  each survivor entered once. A loss in the all-reduce rolls back to the restore point and
  ends with the same parameters as the same losses without ``in_place`` (where the function
  runs again from the restore point); a loss after the step keeps that whole step.
* A fixed size (a replacement joins): the survivors go on in place and the replacement runs
  the function from its start, joining them at ``register_state``. The model's gradients
  come in the reverse of its parameters' order (the last layer's first), so a survivor's DDP
  bucket (rebuilt in that order) and the replacement's (its constructor's, in the
  parameters' order) differ until they are laid out anew: an all-reduce of the two would
  mix gradients.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import torchjob.train
from torchjob.launch.settings import ENV_RESTORE_POINT_EVERY
from torchjob.train import FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, prepare_model

WORLD = 3
STEPS = 8
LOSE_AT = 4
VICTIM = 1


def loop(config: dict[str, Any]) -> None:
    ctx = torchjob.train.get_context()
    out = Path(config["dir"])
    (out / f"enter-{os.getpid()}-gen{ctx.get_generation()}").touch()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state: dict[str, Any] = {"step": 0, "model": model, "optimizer": opt}
    torchjob.train.register_state(state, in_place=config["in_place"])
    while state["step"] < STEPS:
        ctx = torchjob.train.get_context()  # the group may have re-formed under the loop
        rank, generation = ctx.get_world_rank(), ctx.get_generation()
        step = state["step"] + 1
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        lose = generation == 0 and step == LOSE_AT and rank == VICTIM
        if lose and config["where"] == "backward":
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        opt.step()
        if lose:
            os.kill(os.getpid(), signal.SIGKILL)
        state["step"] = step
        stop = torchjob.train.should_stop()
        torchjob.train.get_preemption_info()  # the docs' loop asks every step (a collective)
        torchjob.train.report({"step": step, "world": ctx.get_world_size()})
        if stop:
            return
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save(params, out / f"final-rank{torchjob.train.get_context().get_world_rank()}.pt")


def _fit(tmp_path: Path, *, in_place: bool, where: str, workers: Any) -> tuple[Any, Path]:
    out = tmp_path / f"{'in-place' if in_place else 'again'}-{where}"
    out.mkdir()
    trainer = TorchTrainer(
        loop,
        train_loop_config={"dir": str(out), "in_place": in_place, "where": where},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name="in-place",
            storage_path=str(out / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    )
    return trainer.fit(), out


def _finals(out: Path, world: int) -> list[torch.Tensor]:
    return [torch.load(out / f"final-rank{r}.pt") for r in range(world)]


def _entries(out: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[1] for p in out.glob("enter-*"))


def _in_place(tmp_path: Path, workers: Any) -> list[torch.Tensor]:
    """Rank 1 lost in ``backward()``, in place: a shrink (``workers`` a range) or a
    replacement (a fixed size). Every step reported once, the survivors in the function they
    entered in generation 0 (only a replacement enters it in generation 1), and every rank's
    final parameters alike: returned."""
    result, out = _fit(tmp_path, in_place=True, where="backward", workers=workers)
    after = workers if isinstance(workers, int) else workers[0]
    assert result.error is None
    assert result.world_sizes == [WORLD, after]
    # Each step reported once: the report of the step rolled back counted for nothing.
    assert [m["step"] for m in result.metrics_history] == list(range(1, STEPS + 1))
    assert _entries(out) == ["gen0"] * WORLD + (["gen1"] if after == WORLD else [])
    finals = _finals(out, after)
    assert all(torch.equal(f, finals[0]) for f in finals[1:])
    return finals


def test_a_shrink_goes_on_inside_the_training_function(tmp_path: Path) -> None:
    """The loss meets the survivors in DDP's all-reduce: they roll back to the restore point
    in the same objects and redo the step, as the function run again would."""
    finals = _in_place(tmp_path, (WORLD - 1, WORLD))
    # The same losses without in_place (the function runs again, from the restore point):
    # the same parameters, bit for bit.
    again, out_again = _fit(tmp_path, in_place=False, where="backward", workers=(WORLD - 1, WORLD))
    assert again.error is None
    assert _entries(out_again) == ["gen0"] * WORLD + ["gen1"] * (WORLD - 1)
    assert torch.equal(_finals(out_again, WORLD - 1)[0], finals[0])


def test_the_step_the_loss_broke_is_undone_not_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore point is copied at report 1 only (every 100 reports): the survivors do not
    roll back to it. Their optimizer step after the broken all-reduce did nothing
    (``recovery.step_undo``), what else it moved is put back at report 3, and they do step 4
    again: no step before it is done twice, where the function run again from the restore
    point redoes steps 2 and 3 (at the smaller world size). The same parameters, bit for bit,
    as a rollback to a restore point taken at report 3."""
    monkeypatch.setenv(ENV_RESTORE_POINT_EVERY, "100")
    finals = _in_place(tmp_path, (WORLD - 1, WORLD))
    again, _ = _fit(tmp_path, in_place=False, where="backward", workers=(WORLD - 1, WORLD))
    assert again.error is None
    redone = [m["step"] for m in again.metrics_history]
    assert redone == [1, 2, 3, 2, 3, *range(4, STEPS + 1)], redone
    # A restore point at every report, rolled back to at report 3: the same parameters.
    monkeypatch.setenv(ENV_RESTORE_POINT_EVERY, "1")
    (tmp_path / "every").mkdir()
    assert torch.equal(_in_place(tmp_path / "every", (WORLD - 1, WORLD))[0], finals[0])


def test_a_whole_step_is_kept_when_the_loss_meets_should_stop(tmp_path: Path) -> None:
    """The lost rank dies after its optimizer step: every survivor's step was whole (its
    all-reduce done), and they all wait in ``should_stop()`` at the same report. They keep
    their live state: that step is not done again (it counts with 3 ranks' gradients),
    where the function run again redoes it with 2."""
    result, out = _fit(tmp_path, in_place=True, where="after-step", workers=(WORLD - 1, WORLD))
    assert result.error is None
    assert _entries(out) == ["gen0"] * WORLD
    worlds = {m["step"]: m["world"] for m in result.metrics_history}
    assert [m["step"] for m in result.metrics_history] == list(range(1, STEPS + 1))
    assert worlds[LOSE_AT] == WORLD and worlds[LOSE_AT + 1] == WORLD - 1
    finals = _finals(out, WORLD - 1)
    assert all(torch.equal(f, finals[0]) for f in finals[1:])
    again, _ = _fit(tmp_path, in_place=False, where="after-step", workers=(WORLD - 1, WORLD))
    assert again.error is None
    redone = {m["step"]: m["world"] for m in again.metrics_history}
    assert redone[LOSE_AT] == WORLD - 1  # without in_place the step is done again


def test_a_replacement_joins_the_survivors_in_place(tmp_path: Path) -> None:
    # Only the replacement runs the function in generation 1: the survivors go on in it.
    finals = _in_place(tmp_path, WORLD)
    # The same loss without in_place: every rank runs the function again from the restore
    # point. The same parameters (to rounding: the first step's buckets are laid out
    # otherwise, which orders the all-reduce's sums otherwise).
    again, out_again = _fit(tmp_path, in_place=False, where="backward", workers=WORLD)
    assert again.error is None
    assert _entries(out_again) == ["gen0"] * WORLD + ["gen1"] * WORLD
    assert torch.allclose(_finals(out_again, WORLD)[0], finals[0], rtol=1e-5, atol=1e-7)


def test_a_replacement_joins_survivors_that_undid_their_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore point every 100 reports, and a replacement in the same generation: the
    survivors undo their broken step, take the restore point of report 3 from their live
    state at the agreement and send it to the replacement, instead of rolling back to report
    1's. No step before the broken one is done twice; every rank ends with the parameters of
    a restore point taken at every report."""
    monkeypatch.setenv(ENV_RESTORE_POINT_EVERY, "100")
    finals = _in_place(tmp_path, WORLD)
    monkeypatch.setenv(ENV_RESTORE_POINT_EVERY, "1")
    (tmp_path / "every").mkdir()
    assert torch.equal(_in_place(tmp_path / "every", WORLD)[0], finals[0])


def test_a_replacement_joins_survivors_that_waited_in_should_stop(tmp_path: Path) -> None:
    """The loss meets the survivors in ``should_stop()`` (the victim dies after its step):
    they go on from there, and the loop's ``get_preemption_info()`` and ``report()`` of the
    step rolled back make no collective while the replacement takes its first step (2026-12-04m:
    a survivor's ``get_preemption_info()`` agreed on its own there, and the group hung)."""
    result, out = _fit(tmp_path, in_place=True, where="after-step", workers=WORLD)
    assert result.error is None
    assert result.world_sizes == [WORLD, WORLD]
    assert _entries(out) == ["gen0"] * WORLD + ["gen1"]
    finals = _finals(out, WORLD)
    assert all(torch.equal(f, finals[0]) for f in finals[1:])
