"""Seed 002's linear-regression example on torchjob: PyTorchTrainer with creator functions.

python examples/sgd/train_example.py --num-replicas 2 --epochs 3
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn

from torchjob.sgd import PyTorchTrainer


class LinearDataset(torch.utils.data.Dataset):
    """y = a * x + b, no download needed."""

    def __init__(self, a: float, b: float, size: int = 1000) -> None:
        x = torch.arange(0, 10, 10 / size, dtype=torch.float32)
        self.x = x.unsqueeze(1)
        self.y = (a * x + b).unsqueeze(1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __len__(self) -> int:
        return len(self.x)


def model_creator(config):
    return nn.Linear(1, 1)


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))


def scheduler_creator(optimizer, config):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)


def data_creator(config):
    return LinearDataset(2, 5), LinearDataset(2, 5, size=400)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-replicas", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        scheduler_creator=scheduler_creator,
        config={"lr": 1e-2},
        num_replicas=args.num_replicas,
        batch_size=64,
        scheduler_step_freq="epoch",
    )
    for _ in range(args.epochs):
        stats = trainer.train(max_retries=1)
        print(stats)
    print(trainer.validate())
    checkpoint = os.path.join(tempfile.mkdtemp(), "checkpoint")
    trainer.save(checkpoint)
    model = trainer.get_model()
    print("learned", model.weight.item(), model.bias.item(), "saved to", checkpoint)
    trainer.shutdown()


if __name__ == "__main__":
    main()
