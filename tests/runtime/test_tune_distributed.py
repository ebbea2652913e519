"""Tuner with distributed trials (2 real worker processes per trial, gloo on CPU).

Each search has one clearly better config; the tests check the Tuner finds it,
that trials really ran distributed, that pruning stops a bad trial's workers,
and that only rank 0's checkpoint is kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from torchjob import tune
from torchjob.sgd import PyTorchTrainable

pytestmark = pytest.mark.runtime


def regression_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    return TensorDataset(x, x @ torch.tensor([[2.0], [-1.0]]))


def train_regression(config: dict[str, Any], checkpoint_dir: str | None = None) -> None:
    """Seed 001's shape: DDP when distributed, report per epoch, checkpoint per epoch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    net: nn.Module = nn.Linear(2, 1)
    if tune.is_distributed_trainable():
        net = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=config["lr"])
    loader = DataLoader(regression_data(), batch_size=16)
    for epoch in range(config.get("epochs", 3)):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
        with tune.distributed_checkpoint_dir(step=epoch) as checkpoint_dir:
            path = os.path.join(checkpoint_dir, f"checkpoint-rank{dist.get_rank()}")
            torch.save((net.state_dict(), optimizer.state_dict()), path)
        tune.report(loss=loss.item(), world_size=dist.get_world_size())


def test_grid_search_over_distributed_trials_finds_the_better_lr(tmp_path: Path) -> None:
    trainable = tune.DistributedTrainableCreator(train_regression, num_workers=2, timeout_s=60)
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([1e-4, 0.1]), "epochs": 3},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="grid", storage_path=str(tmp_path)),
    )
    grid = tuner.fit()
    assert len(grid) == 2 and grid.num_errors == 0
    best = grid.get_best_result()
    assert best.config["lr"] == 0.1
    assert best.metrics["world_size"] == 2  # every trial was a 2-process group
    assert best.metrics["training_iteration"] == 3
    assert [m["training_iteration"] for m in best.metrics_history] == [1, 2, 3]
    # distributed_checkpoint_dir keeps rank 0's checkpoint only.
    trial_dir = Path(best.path)
    kept = sorted(p.relative_to(trial_dir).as_posix() for p in trial_dir.rglob("checkpoint-*"))
    assert kept == [f"checkpoint_{e:06d}/checkpoint-rank0" for e in range(3)]
    df = grid.get_dataframe()
    assert sorted(df["config/lr"]) == [1e-4, 0.1]
    assert set(df["status"]) == {"TERMINATED"}


def endless_if_bad(config: dict[str, Any]) -> None:
    """A good trial improves for 4 reports; a bad one would report for a long time, badly."""
    import torch.distributed as dist

    steps = 4 if config["quality"] == "good" else 100_000
    for step in range(steps):
        t = torch.tensor([1.0])
        dist.all_reduce(t)  # a real collective per step: both ranks stay in lockstep
        loss = 1.0 / (step + 1) if config["quality"] == "good" else 10.0
        tune.report(loss=loss)


def test_median_pruner_stops_a_bad_distributed_trial(tmp_path: Path) -> None:
    tuner = tune.Tuner(
        tune.DistributedTrainableCreator(endless_if_bad, num_workers=2, timeout_s=60),
        param_space={"quality": tune.grid_search(["good", "bad"])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", pruner="median"),
        run_config=tune.RunConfig(storage_path=str(tmp_path)),
    )
    grid = tuner.fit()
    good, bad = grid[0], grid[1]
    assert good.status == "TERMINATED" and len(good.metrics_history) == 4
    assert bad.status == "PRUNED"
    assert len(bad.metrics_history) < 100_000
    assert grid.get_best_result().config["quality"] == "good"


def torch_trainer_loop(config: dict[str, Any]) -> None:
    import torchjob.train
    from torchjob.train.torch import prepare_data_loader, prepare_model

    torch.manual_seed(0)
    model = prepare_model(nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = prepare_data_loader(DataLoader(regression_data(), batch_size=16))
    for _epoch in range(config["epochs"]):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        torchjob.train.report(
            {"loss": loss.item(), "world_size": torchjob.train.get_context().get_world_size()}
        )


def test_tuner_over_a_torch_trainer(tmp_path: Path) -> None:
    from torchjob.train import RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer

    trainer = TorchTrainer(
        torch_trainer_loop,
        train_loop_config={"epochs": 2, "lr": 0.0},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "unused"), progress=False),
    )
    tuner = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([1e-4, 0.1])}},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="tt", storage_path=str(tmp_path)),
    )
    grid = tuner.fit()
    assert grid.num_errors == 0, grid.errors
    assert [r.config["train_loop_config"]["lr"] for r in grid] == [1e-4, 0.1]
    best = grid.get_best_result()
    assert best.config["train_loop_config"]["lr"] == 0.1
    assert best.metrics["world_size"] == 2
    assert len(best.metrics_history) == 2


def sgd_model_creator(config: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(2, 1)


def sgd_optimizer_creator(model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=config["lr"])


def sgd_data_creator(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset]:
    return regression_data(), regression_data()


def test_pytorch_trainable_with_stop_criterion(tmp_path: Path) -> None:
    tuner = tune.Tuner(
        PyTorchTrainable,
        param_space={
            "model_creator": sgd_model_creator,
            "data_creator": sgd_data_creator,
            "optimizer_creator": sgd_optimizer_creator,
            "loss_creator": nn.MSELoss,
            "num_replicas": 2,
            "batch_size": 32,
            "config": {"lr": tune.grid_search([1e-4, 0.1])},
        },
        tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 2}),
    )
    grid = tuner.fit()
    assert grid.num_errors == 0, grid.errors
    assert [len(r.metrics_history) for r in grid] == [2, 2]
    best = grid.get_best_result()
    assert best.config["config"]["lr"] == 0.1
    assert best.metrics["num_samples"] == 64 and best.metrics["epoch"] == 2
