"""Seed 003 (Ray Train's "getting started" quickstart) with only the imports changed, as the
script of a TorchJob (tests/cluster/test_real_node.py). As in tests/runtime/test_train_seeds.py,
FashionMNIST and resnet18 (a download and torchvision) are swapped for a synthetic
FashionMNIST-shaped dataset and a small CNN; everything else is the seed's code.
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

import torchjob.train.torch  # was: import ray.train.torch


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


if __name__ == "__main__":
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
    print(f"quickstart done: {len(result.metrics_history)} reports, loaded {checkpoint_dir}")
