"""Train a small MLP on scikit-learn's bundled digits with torchjob, kill a worker midway, recover.

The training function is plain Ray Train code with the imports changed
(``ray.train`` -> ``torchjob.train``). ``make demo`` runs::

    python examples/digits/train_digits.py --workers 3 --epochs 12 --kill-at-epoch 5

At ``--kill-at-epoch`` the last rank sends itself SIGKILL (a real process death,
as when a machine is lost). The trainer sees the death, names the rank, and
restarts the group from the latest committed checkpoint on its own; training
continues from that epoch. The script ends with the test accuracy of the model
loaded back from ``result.checkpoint``.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import torchjob.train
from torchjob.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, prepare_data_loader, prepare_model


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def load_split() -> tuple[TensorDataset, TensorDataset]:
    """Digits (1797 8x8 images, shipped with scikit-learn: no download), scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0)

    def ds(a: Any, b: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(a, dtype=torch.float32), torch.tensor(b))

    return ds(x_train, y_train), ds(x_test, y_test)


def accuracy(model: torch.nn.Module, data: TensorDataset) -> float:
    x, y = data.tensors
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def train_func(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    train_data, test_data = load_split()
    model = prepare_model(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loader = prepare_data_loader(
        DataLoader(train_data, batch_size=config["batch_size"], shuffle=True)
    )
    ctx = torchjob.train.get_context()

    start_epoch = 0
    checkpoint = torchjob.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, config["epochs"]):
        if ctx.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if (
            epoch == config["kill_at_epoch"]
            and ctx.get_generation() == 0
            and ctx.get_world_rank() == ctx.get_world_size() - 1
        ):
            print(
                f"demo: SIGKILL to worker rank {ctx.get_world_rank()} (pid {os.getpid()})",
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)
        model.eval()
        metrics = {
            "epoch": epoch,
            "loss": loss.item(),
            "test_acc": accuracy(getattr(model, "module", model), test_data),
            "workers": ctx.get_world_size(),
        }
        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {
                    "model": getattr(model, "module", model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                },
                os.path.join(d, "model.pt"),
            )
            torchjob.train.report(metrics, checkpoint=torchjob.train.Checkpoint.from_directory(d))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--kill-at-epoch", type=int, default=5, help="-1: never")
    parser.add_argument("--storage", default=os.path.join(os.getcwd(), "results"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={
            "lr": 1e-3 * args.workers,
            "batch_size": 32,
            "epochs": args.epochs,
            "kill_at_epoch": args.kill_at_epoch,
        },
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=f"digits-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=os.path.abspath(args.storage),
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="test_acc"
            ),
            failure_config=FailureConfig(max_failures=2),
            progress=not args.no_progress,
        ),
    )
    result = trainer.fit()

    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"))
    model = make_model()
    model.load_state_dict(state["model"])
    _, test_data = load_split()
    print(
        f"\nfinal test accuracy {accuracy(model, test_data):.3f} after {state['epoch'] + 1} epochs "
        f"({len(result.world_sizes)} generation(s), {time.monotonic() - started:.1f}s)"
    )
    print(f"checkpoint: {result.checkpoint.path}")


if __name__ == "__main__":
    main()
