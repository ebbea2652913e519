"""PyTorchTrainer with 2 real worker processes (gloo, CPU): train, validate, save, restore, get_model, fp16."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from torchjob.launch import WorkerGroupError
from torchjob.sgd import PyTorchTrainer, SGDConfigError

pytestmark = pytest.mark.runtime

N_TRAIN = 256
N_VAL = 128


def blobs(n: int, seed: int) -> TensorDataset:
    """Two well-separated Gaussian blobs: a linear classifier reaches ~100% accuracy."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    centers = torch.tensor([[-2.0, -2.0], [2.0, 2.0]])
    x = centers[labels] + torch.randn(n, 2, generator=g)
    return TensorDataset(x, labels)


def model_creator(config: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(2, 2)


def optimizer_creator(model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.1))


def data_creator(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset]:
    return blobs(N_TRAIN, seed=1), blobs(N_VAL, seed=2)


def scheduler_creator(optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def make_trainer(**overrides: Any) -> PyTorchTrainer:
    kwargs: dict[str, Any] = {
        "loss_creator": nn.CrossEntropyLoss,
        "config": {"lr": 0.1},
        "num_replicas": 2,
        "batch_size": 32,
        "timeout_s": 60,
    }
    kwargs.update(overrides)
    return PyTorchTrainer(model_creator, data_creator, optimizer_creator, **kwargs)


def recording_hook(directory: Path) -> Callable[[], None]:
    """An initialization_hook that leaves ``hook-<rank>`` (its pid inside) in ``directory``."""

    def hook() -> None:
        import os

        from torchjob.launch import worker_info

        info = worker_info()
        assert info is not None
        (directory / f"hook-{info.rank}").write_text(str(os.getpid()))

    return hook


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hooks")


@pytest.fixture(scope="module")
def trainer(hook_dir: Path) -> Iterator[PyTorchTrainer]:
    # The module's shared trainer also carries the initialization hook under test, so that
    # test does not start 2 more workers of its own.
    t = make_trainer(
        scheduler_creator=scheduler_creator,
        scheduler_step_freq="epoch",
        initialization_hook=recording_hook(hook_dir),
    )
    yield t
    t.shutdown()


def test_train_aggregates_over_replicas_and_learns(trainer: PyTorchTrainer) -> None:
    before = trainer.validate()
    first = trainer.train()
    second = trainer.train()
    # Each replica sees half of the data: the aggregate covers the whole set once per pass.
    assert first["num_samples"] == N_TRAIN
    assert first["batch_count"] == 2 * (N_TRAIN // 2 // 16)
    assert (first["epoch"], second["epoch"]) == (1, 2)
    assert second["train_loss"] < first["train_loss"]
    after = trainer.validate()
    assert after["num_samples"] == N_VAL
    assert after["val_loss"] < before["val_loss"]
    assert after["val_accuracy"] > 0.9


def test_num_steps_limits_the_batches(trainer: PyTorchTrainer) -> None:
    stats = trainer.train(num_steps=3)
    assert stats["batch_count"] == 2 * 3
    assert stats["num_samples"] == 2 * 3 * 16
    partial = trainer.validate(num_steps=1)
    assert partial["num_samples"] == 2 * 16


def test_get_model_is_unwrapped_on_cpu_and_matches_validation(trainer: PyTorchTrainer) -> None:
    model = trainer.get_model()
    assert type(model) is nn.Linear
    assert model.weight.device.type == "cpu"
    # The exported model scores the validation set like the replicas do.
    x, y = blobs(N_VAL, seed=2).tensors
    accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    assert accuracy == pytest.approx(trainer.validate()["val_accuracy"], abs=1e-6)


def test_save_then_restore_into_a_new_trainer(trainer: PyTorchTrainer, tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "checkpoint"
    assert trainer.save(path) == str(path)
    expected = trainer.validate()
    expected_model = trainer.get_model()
    other = make_trainer(scheduler_creator=scheduler_creator, scheduler_step_freq="epoch")
    try:
        assert other.epoch == 0
        other.restore(path)
        assert other.epoch == trainer.epoch
        assert other.validate()["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-6)
        restored = other.get_model()
        for a, b in zip(
            restored.state_dict().values(), expected_model.state_dict().values(), strict=True
        ):
            assert torch.equal(a, b)
        # The scheduler state came along: both step the same learning rate next.
        assert other.train(num_steps=1)["epoch"] == trainer.epoch + 1
    finally:
        other.shutdown()


def bf16_model_creator(config: dict[str, Any]) -> nn.Module:
    class Probe(nn.Module):
        """Records in a buffer whether its Linear ran in bfloat16 (autocast on CPU)."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lin = nn.Linear(2, 2)
            self.register_buffer("saw_bf16", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.lin(x)
            if self.training:
                self.saw_bf16.fill_(float(out.dtype == torch.bfloat16))
            return out

    return Probe()


def test_use_fp16_on_cpu_trains_under_bf16_autocast() -> None:
    t = PyTorchTrainer(
        bf16_model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.CrossEntropyLoss,
        num_replicas=2,
        batch_size=32,
        use_fp16=True,
        apex_args={"opt_level": "O1", "verbosity": 0},
        timeout_s=60,
    )
    try:
        first = t.train()
        second = t.train()
        assert second["train_loss"] < first["train_loss"]
        assert t.validate()["val_accuracy"] > 0.9
        model = t.get_model()
        assert model.saw_bf16.item() == 1.0
        assert model.lin.weight.dtype == torch.float32  # master weights stay fp32
    finally:
        t.shutdown()


def test_initialization_hook_runs_on_every_worker(trainer: PyTorchTrainer, hook_dir: Path) -> None:
    assert sorted(p.name for p in hook_dir.iterdir()) == ["hook-0", "hook-1"]
    pids = {int(p.read_text()) for p in hook_dir.iterdir()}
    assert len(pids) == 2  # two worker processes, one hook call each


def test_user_error_names_the_rank_and_is_not_retried() -> None:
    def bad_data(config: dict[str, Any]) -> Any:
        return blobs(64, seed=1)  # no validation set

    t = PyTorchTrainer(
        model_creator,
        bad_data,
        optimizer_creator,
        nn.CrossEntropyLoss,
        num_replicas=2,
        timeout_s=60,
    )
    try:
        with pytest.raises(
            WorkerGroupError, match=r"^rank \d raised ValueError: .*no validation data"
        ):
            t.validate()
    finally:
        t.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"scheduler_step_freq": "step"}, "scheduler_step_freq", id="bad-step-freq"),
        pytest.param({"num_replicas": 0}, "num_replicas", id="no-replicas"),
        pytest.param({"use_fp16": True, "apex_args": {"opt_level": "O3"}}, "O3", id="apex-O3"),
        pytest.param({"apex_args": {"opt_level": "O1"}}, "use_fp16", id="apex-without-fp16"),
    ],
)
def test_bad_arguments_fail_before_starting_workers(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SGDConfigError, match=message):
        make_trainer(**kwargs)
