"""The seeds' remaining APIs: seed 004's session era, seeds 000/001's ``tune.run``, seed 000's
creator conventions and an exact ``validate()``. Imports mapped as docs/runtime.md's table says."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.runtime


def test_seed_004_session_era_with_data_parallel_trainer(tmp_path: Path) -> None:
    from torchjob import train  # was: from ray import train
    from torchjob.air import RunConfig, ScalingConfig, session  # was: from ray.air import ...
    from torchjob.train.data_parallel_trainer import DataParallelTrainer
    from torchjob.train.torch import TorchConfig

    def train_func():  # type: ignore[no-untyped-def]
        model = train.torch.prepare_model(nn.Linear(8, 2))
        worker_batch_size = 4
        data_loader = DataLoader(
            TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))),
            batch_size=worker_batch_size,
        )
        data_loader = train.torch.prepare_data_loader(data_loader)
        start = session.get_checkpoint()
        for X, y in data_loader:
            torch.nn.functional.cross_entropy(model(X), y).backward()
        global_batch_size = worker_batch_size * session.get_world_size()
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            session.report(
                {
                    "global_batch_size": global_batch_size,
                    "rank": session.get_world_rank(),
                    "local_rank": session.get_local_rank(),
                    "local_world_size": session.get_local_world_size(),
                    "trial": session.get_trial_name(),
                    "resumed": start is not None,
                },
                checkpoint=train.Checkpoint.from_directory(d),
            )

    trainer = DataParallelTrainer(
        train_func,
        backend_config=TorchConfig(),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="session-era", storage_path=str(tmp_path), progress=False),
    )
    result = trainer.fit()
    assert result.metrics == {
        "global_batch_size": 8,
        "rank": 0,
        "local_rank": 0,
        "local_world_size": 2,
        "trial": "session-era",
        "resumed": False,
    }
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert set(torch.load(os.path.join(d, "model.pt"))) == {"weight", "bias"}
    with pytest.raises(TypeError, match="backend_config"):
        DataParallelTrainer(train_func, backend_config="nccl")  # type: ignore[arg-type]


# --- seed 000: creators of RaySGD's train_example.py, tune.run over PyTorchTrainable ------------
class LinearDataset(torch.utils.data.Dataset):
    def __init__(self, a: float, b: float, size: int = 128) -> None:
        x = torch.linspace(0, 1, size)
        self.x, self.y = x.unsqueeze(1), (a * x + b).unsqueeze(1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __len__(self) -> int:
        return len(self.x)


def model_creator(config):  # type: ignore[no-untyped-def]
    return nn.Linear(1, 1)


def optimizer_creator(model, config):  # type: ignore[no-untyped-def]
    """Returns criterion, optimizer (seed 000's convention: no loss_creator)."""
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))
    return criterion, optimizer


def data_creator(batch_size, config):  # type: ignore[no-untyped-def]
    return LinearDataset(2, 5), LinearDataset(2, 5, size=397)


def test_seed_000_conventions_and_an_exact_validate() -> None:
    from torchjob.sgd import PyTorchTrainer  # was: ray.experimental.sgd.pytorch

    trainer = PyTorchTrainer(
        model_creator, data_creator, optimizer_creator, num_replicas=2, batch_size=32
    )
    try:
        stats = trainer.train()
        assert stats["num_samples"] == 128 and stats["train_loss"] > 0
        # 397 validation samples over 2 workers: 199 + 198, none padded in.
        assert trainer.validate()["num_samples"] == 397
    finally:
        trainer.shutdown()


def test_seed_000_bad_optimizer_creator_fails_at_construction() -> None:
    from torchjob.launch import WorkerGroupError
    from torchjob.sgd import PyTorchTrainer

    # The constructor builds the replicas, so a creator's mistake surfaces there, named.
    # (No loss at all fails there too: "no loss: ... pass loss_creator=", unit-tested.)
    with pytest.raises(WorkerGroupError, match="optimizer_creator must return"):
        PyTorchTrainer(model_creator, data_creator, lambda m, c: (m, m), num_replicas=1)


def test_seed_000_tune_run_over_pytorch_trainable(tmp_path: Path) -> None:
    from torchjob import tune
    from torchjob.sgd import PyTorchTrainable

    analysis = tune.run(
        PyTorchTrainable,
        config={
            "model_creator": model_creator,
            "data_creator": data_creator,
            "optimizer_creator": optimizer_creator,
            "num_replicas": 1,
            "config": {"lr": tune.grid_search([1e-4, 1e-1])},
        },
        num_samples=1,
        stop={"training_iteration": 2},
        local_dir=str(tmp_path),
        verbose=0,
    )
    assert len(analysis.trials) == 2
    assert [t.status for t in analysis.trials] == ["TERMINATED", "TERMINATED"]
    assert analysis.get_best_config(metric="val_loss", mode="min")["config"] == {"lr": 1e-1}
    # The seed's own last line: RaySGD's name for the validation loss (issue 29, item 6).
    assert analysis.get_best_config(metric="validation_loss", mode="min")["config"] == {"lr": 1e-1}
    with pytest.raises(ValueError, match="no trial reported the metric 'validation_accuracy'"):
        analysis.get_best_config(metric="validation_accuracy", mode="max")
    frame = analysis.dataframe()
    assert list(frame["training_iteration"]) == [2, 2]
    assert "config/config/lr" in frame.columns


# --- seed 001: a DistributedTrainableCreator trainable through tune.run -------------------
def train_linear(config, checkpoint_dir=None):  # type: ignore[no-untyped-def]
    from torchjob import tune

    net = nn.Linear(1, 1)
    if tune.is_distributed_trainable():
        net = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=config["lr"])
    x = torch.linspace(0, 1, 64).unsqueeze(1)
    y = 2 * x + 5
    for epoch in range(3):
        loss = nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tune.distributed_checkpoint_dir(step=epoch) as checkpoint_dir:
            torch.save(net.state_dict(), os.path.join(checkpoint_dir, "checkpoint"))
        world = torch.distributed.get_world_size() if tune.is_distributed_trainable() else 1
        tune.report(loss=loss.item(), world=world)


def test_seed_001_tune_run_honours_resources_per_trial(tmp_path: Path) -> None:
    from torchjob import tune

    distributed = tune.DistributedTrainableCreator(train_linear, num_workers=1)
    analysis = tune.run(
        distributed,
        resources_per_trial={"num_workers": 2},
        config={"lr": tune.grid_search([1e-3, 1e-1])},
        metric="loss",
        mode="min",
        local_dir=str(tmp_path),
        verbose=0,
    )
    assert [t.last_result["world"] for t in analysis.trials] == [2, 2]
    best = analysis.get_best_trial()
    assert best is not None and best.config == {"lr": 1e-1}
    assert analysis.best_config == {"lr": 1e-1}
    checkpoint = analysis.best_checkpoint
    assert checkpoint is not None and checkpoint.path.endswith("checkpoint_000002")
    assert (Path(checkpoint.path) / "checkpoint").is_file()
    assert best.metric_analysis["loss"]["last"] == best.last_result["loss"]


def test_tune_checkpoint_dir_in_a_function_trainable(tmp_path: Path) -> None:
    from torchjob import tune

    def trainable(config):  # type: ignore[no-untyped-def]
        for step in range(2):
            with tune.checkpoint_dir(step=step) as d:
                Path(d, "state").write_text(str(step))
            tune.report(score=config["a"] * step)

    analysis = tune.run(
        trainable,
        config={"a": tune.grid_search([1, 2])},
        local_dir=str(tmp_path),
        verbose=0,
    )
    best = analysis.get_best_checkpoint(metric="score", mode="max")
    assert best is not None and Path(best.path, "state").read_text() == "1"
    assert analysis.get_best_config("score", "max") == {"a": 2}
    with pytest.raises(tune.TuneError, match="1 trial"):
        tune.run(lambda c: 1 / 0, local_dir=str(tmp_path), verbose=0)
