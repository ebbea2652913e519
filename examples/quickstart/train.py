"""Seed 003's quickstart ("Get Started with Distributed Training using PyTorch"), imports mapped
to torchjob. It runs unchanged on a laptop (``python train.py``: 2 local workers), under
``torchjob run -f examples/quickstart/job.yaml`` (2 local pods) and as a TorchJob on a cluster.

Two changes from the seed, both for a machine without internet or torchvision: the model is a
small CNN instead of ``resnet18`` and the data is a FashionMNIST-shaped random dataset
(``QUICKSTART_SAMPLES`` images; the seed downloads FashionMNIST). Everything after ``fit()``
runs on every pod: each gets the same ``Result`` (metrics, committed checkpoint, path).
"""

import os
import tempfile

import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

import torchjob.train.torch  # was: import ray.train.torch

EPOCHS = int(os.environ.get("QUICKSTART_EPOCHS", "2"))


def FashionMNIST(root, train, download, transform=None):
    """FashionMNIST's shape (1x28x28 images, 10 classes), random but fixed."""
    g = torch.Generator().manual_seed(0)
    n = int(os.environ.get("QUICKSTART_SAMPLES", "512"))
    return TensorDataset(
        torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def resnet18(num_classes):
    """A small CNN in place of torchvision's resnet18 (same input and output)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, kernel_size=3, stride=2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 13 * 13, num_classes),
    )


def train_func(config):
    # Model, Loss, Optimizer
    model = resnet18(num_classes=10)
    # [1] Prepare model.
    model = torchjob.train.torch.prepare_model(model)
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=config.get("lr", 0.001))

    # Data
    data_dir = os.path.join(tempfile.gettempdir(), "data")
    train_data = FashionMNIST(root=data_dir, train=True, download=True)
    train_loader = DataLoader(train_data, batch_size=128, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = torchjob.train.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(config.get("epochs", EPOCHS)):
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
            torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            torchjob.train.report(
                metrics,
                checkpoint=torchjob.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if torchjob.train.get_context().get_world_rank() == 0:
            print(metrics)


if __name__ == "__main__":
    # [4] Configure scaling and resource requirements.
    scaling_config = torchjob.train.ScalingConfig(num_workers=2, use_gpu=torch.cuda.is_available())

    # [5] Launch distributed training job.
    trainer = torchjob.train.torch.TorchTrainer(train_func, scaling_config=scaling_config)
    result = trainer.fit()

    # [6] Load the trained model (on every pod: each fit() returned the same Result).
    with result.checkpoint.as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model = resnet18(num_classes=10)
        model.load_state_dict(model_state_dict)
    print(
        f"[quickstart] loaded {result.checkpoint.path} "
        f"(epoch {result.metrics['epoch']}, loss {result.metrics['loss']:.4f})"
    )
    if torchjob.train.is_primary():  # side effects (uploads, registries) once, on pod 0
        print(f"[quickstart] primary: results in {result.path}")
