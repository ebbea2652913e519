"""Seed 001 (Ray Tune with DistributedDataParallel) as the script of a TorchJob
(tests/cluster/test_real_node.py): the Tuner runs in the job's pod and every trial is a fresh
2-process gloo group in that pod, through ``DistributedTrainableCreator``. The seed's CIFAR
``Net`` and data are swapped for a small regression so that the grid finishes in seconds;
``is_distributed_trainable``, ``DistributedDataParallel`` and ``distributed_checkpoint_dir``
are used exactly as the seed uses them.

    python tests/e2e/seed_tune.py STORAGE_PATH
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchjob import tune
from torchjob.tune import DistributedTrainableCreator, distributed_checkpoint_dir


class Net(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


def train_regression(config, checkpoint_dir=None, data_size=64):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = Net(config["hidden"])

    #### Using distributed data parallel training
    if tune.is_distributed_trainable():
        net = DistributedDataParallel(net)

    optimizer = torch.optim.SGD(net.parameters(), lr=config["lr"])
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(data_size, 2, generator=g)
    y = x @ torch.tensor([[2.0], [-1.0]])
    for epoch in range(3):
        for _ in range(4):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
        # Avoids redundant checkpointing on different processes.
        with distributed_checkpoint_dir(step=epoch) as checkpoint_dir:
            path = os.path.join(checkpoint_dir, "checkpoint")
            torch.save((net.state_dict(), optimizer.state_dict()), path)
        tune.report(loss=loss.item(), world_size=dist.get_world_size())


if __name__ == "__main__":
    distributed_train = DistributedTrainableCreator(
        partial(train_regression, data_size=64),
        num_workers=2,  # number of parallel workers to use
        num_cpus_per_worker=1,
    )
    grid = tune.Tuner(
        distributed_train,
        param_space={"lr": tune.grid_search([1e-4, 0.05]), "hidden": 8},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="seed-001", storage_path=sys.argv[1]),
    ).fit()
    best = grid.get_best_result()
    print(
        f"tune done: {len(grid)} trials, {grid.num_errors} errors, best lr {best.config['lr']},"
        f" world size {best.metrics['world_size']},"
        f" iterations {best.metrics['training_iteration']}",
        flush=True,
    )
