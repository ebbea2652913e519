"""``train(max_retries=N)``: a worker killed mid-pass restarts the group from the pre-pass checkpoint.

The recovered run must end with exactly the weights of a run that never failed:
the retry starts from the state saved before the pass, with the same data order.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from torchjob.launch import WorkerDiedError
from torchjob.sgd import PyTorchTrainer, default_train

pytestmark = pytest.mark.runtime


def model_creator(config: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 1)


def optimizer_creator(model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def data_creator(config: dict[str, Any]) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(128, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3
    return TensorDataset(x, y)


def dying_train(
    config: dict[str, Any],
    model: Any,
    iterator: Any,
    criterion: Any,
    optimizer: Any,
    scheduler: Any,
) -> dict[str, Any]:
    """The default train pass, except that rank 1 kills itself mid-pass once (marker file)."""
    from torchjob.launch import worker_info

    marker = Path(config["marker"])
    info = worker_info()
    assert info is not None

    def batches() -> Any:
        for i, batch in enumerate(iterator):
            if info.rank == 1 and i == 2 and config["die"] and not marker.exists():
                marker.write_text("died")
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch

    return default_train(config, model, batches(), criterion, optimizer, scheduler)


def run(tmp_path: Path, *, die: bool, max_retries: int, passes: int = 3) -> nn.Module:
    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        train_function=dying_train,
        config={"marker": str(tmp_path / "marker"), "die": die},
        num_replicas=2,
        batch_size=16,
        timeout_s=30,
    )
    try:
        for _ in range(passes):
            stats = trainer.train(max_retries=max_retries, checkpoint="auto")
            assert stats["num_samples"] == 128
        assert stats["epoch"] == passes
        model: nn.Module = trainer.get_model()
        return model
    finally:
        trainer.shutdown()


def test_killed_worker_recovers_to_the_same_weights_as_a_clean_run(tmp_path: Path) -> None:
    clean = run(tmp_path / "clean", die=False, max_retries=0)
    (tmp_path / "faulty").mkdir()
    recovered = run(tmp_path / "faulty", die=True, max_retries=2)
    assert (tmp_path / "faulty" / "marker").read_text() == "died"  # the failure really happened
    for a, b in zip(clean.state_dict().values(), recovered.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)


def test_without_retries_the_lost_worker_is_reported(tmp_path: Path) -> None:
    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        train_function=dying_train,
        config={"marker": str(tmp_path / "marker"), "die": True},
        num_replicas=2,
        timeout_s=30,
    )
    try:
        with pytest.raises(WorkerDiedError, match=r"^rank 1 .*SIGKILL"):
            trainer.train(max_retries=0)
    finally:
        trainer.shutdown()


def test_checkpoint_path_is_written_before_each_pass(tmp_path: Path) -> None:
    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        num_replicas=2,
        timeout_s=30,
    )
    try:
        path = tmp_path / "pre-pass.pt"
        trainer.train(checkpoint=path)
        saved = torch.load(path, weights_only=False)
        assert saved["epoch"] == 0  # the state before the pass
        trainer.train(checkpoint=path)
        assert torch.load(path, weights_only=False)["epoch"] == 1
    finally:
        trainer.shutdown()
