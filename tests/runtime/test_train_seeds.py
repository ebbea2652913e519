"""The seeds' own Ray Train snippets (docs 003 and 004) with only the imports changed.

FashionMNIST and resnet18 need a download and torchvision; they are swapped for a
synthetic FashionMNIST-shaped dataset and a small CNN. Everything else, including
``model.module.state_dict()``, ``use_gpu=True`` (CPU fallback) and the default
storage path, is as in the docs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset


def FashionMNISTLike() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(256, 1, 28, 28, generator=g), torch.randint(0, 10, (256,), generator=g)
    )


def small_cnn(num_classes: int = 10) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, kernel_size=5, stride=2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 12 * 12, num_classes),
    )


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(
    0 < _gpus() < 2,
    reason="the seed asks for 2 GPU workers; this host has 1 GPU (CPU fallback needs 0)",
)
def test_seed_003_getting_started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the default storage path lives under ~
    import torchjob.train.torch  # was: import ray.train.torch

    def train_func(config):  # type: ignore[no-untyped-def]
        # Model, Loss, Optimizer
        model = small_cnn(num_classes=10)
        # [1] Prepare model.
        model = torchjob.train.torch.prepare_model(model)
        criterion = CrossEntropyLoss()
        optimizer = Adam(model.parameters(), lr=0.001)

        # Data
        train_data = FashionMNISTLike()
        train_loader = DataLoader(train_data, batch_size=128, shuffle=True)
        # [2] Prepare dataloader.
        train_loader = torchjob.train.torch.prepare_data_loader(train_loader)

        # Training
        for epoch in range(3):
            if torchjob.train.get_context().get_world_size() > 1:
                train_loader.sampler.set_epoch(epoch)

            for images, labels in train_loader:
                outputs = model(images)
                loss = criterion(outputs, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # [3] Report metrics and checkpoint.
            metrics = {"loss": loss.item(), "epoch": epoch}
            with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
                torch.save(
                    model.module.state_dict(),
                    os.path.join(temp_checkpoint_dir, "model.pt"),
                )
                torchjob.train.report(
                    metrics,
                    checkpoint=torchjob.train.Checkpoint.from_directory(temp_checkpoint_dir),
                )
            if torchjob.train.get_context().get_world_rank() == 0:
                print(metrics)

    # [4] Configure scaling and resource requirements.
    scaling_config = torchjob.train.ScalingConfig(num_workers=2, use_gpu=True)

    # [5] Launch distributed training job.
    trainer = torchjob.train.torch.TorchTrainer(
        train_func,
        scaling_config=scaling_config,
    )
    result = trainer.fit()

    # [6] Load the trained model.
    with result.checkpoint.as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model = small_cnn(num_classes=10)
        model.load_state_dict(model_state_dict)

    assert result.metrics == result.metrics_history[-1]
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2]
    assert str(tmp_path / "torchjob_results") in result.path


def test_seed_004_session_era_conversion(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    from torchjob import train  # was: from ray import train
    from torchjob.train import ScalingConfig  # was: from ray.air import ScalingConfig
    from torchjob.train.torch import (
        TorchConfig,
        TorchTrainer,
    )  # was: from ray.train.torch import ...

    def train_func():  # type: ignore[no-untyped-def]
        model = torch.nn.Linear(28 * 28, 10)
        model = train.torch.prepare_model(model)
        my_dataset = TensorDataset(torch.randn(64, 28 * 28), torch.randint(0, 10, (64,)))
        data_loader = DataLoader(my_dataset, batch_size=16)
        data_loader = train.torch.prepare_data_loader(data_loader)
        seen = 0
        for X, y in data_loader:
            loss = torch.nn.functional.cross_entropy(model(X), y)
            loss.backward()
            seen += len(X)
        global_batch_size = 16 * train.get_context().get_world_size()
        train.report({"seen": seen, "global_batch_size": global_batch_size})

    use_gpu = False
    trainer = TorchTrainer(
        train_func,
        torch_backend=TorchConfig(),
        scaling_config=ScalingConfig(use_gpu=use_gpu, num_workers=2),
    )
    result = trainer.fit()
    assert result.metrics == {"seen": 32, "global_batch_size": 32}
