"""CUDA paths of the runtime, on real GPUs: nccl, device placement, checkpoints, torch.amp.

Every test here is skipped where ``torch.cuda.is_available()`` is False (CI, laptops),
so ``make test`` reports them as skipped. On a GPU machine:

    python -m pytest tests/gpu -m gpu -v
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.gpu_marks import NEEDS_GPU
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchjob.train
from torchjob.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, get_device, prepare_data_loader, prepare_model

pytestmark = NEEDS_GPU

TRUE_W = [[1.0], [-2.0], [0.5], [3.0]]


def _data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor(TRUE_W))


def _mse_on_cpu(model: nn.Module) -> float:
    x, y = _data().tensors
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def gpu_regression(config: dict[str, Any]) -> None:
    """Linear regression on cuda; one report with a checkpoint per epoch; resumes from it.

    Generation 0 raises after ``config["fail_after_epoch"]``'s checkpoint, so the
    restarted group must reload that checkpoint onto the GPU and carry on.
    """
    import torch.distributed as dist

    ctx = torchjob.train.get_context()
    device = get_device()
    torch.manual_seed(0)
    model = prepare_model(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = prepare_data_loader(DataLoader(_data(), batch_size=32, shuffle=True))
    start = 0
    resumed_from = -1
    ckpt = torchjob.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = resumed_from = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        loader.sampler.set_epoch(epoch)
        total, n = 0.0, 0
        for xb, yb in loader:
            if xb.device != device or yb.device != device:
                raise AssertionError(f"batch on {xb.device}/{yb.device}, expected {device}")
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(xb)
            n += len(xb)
        param = next(model.parameters())
        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                os.path.join(d, "state.pt"),
            )
            torchjob.train.report(
                {
                    "epoch": epoch,
                    "loss": total / n,
                    "generation": ctx.get_generation(),
                    "resumed_from": resumed_from,
                    "backend": dist.get_backend(),
                    "device": str(device),
                    "param_device": str(param.device),
                    "batch_device": str(xb.device),
                    "current_device": torch.cuda.current_device(),
                    "weight_sum": model.weight.sum().item(),
                },
                checkpoint=Checkpoint.from_directory(d),
            )
        if ctx.get_generation() == 0 and epoch == config["fail_after_epoch"]:
            raise RuntimeError("injected failure after a GPU checkpoint")


def test_torch_trainer_one_gpu_worker(tmp_path: Path) -> None:
    """nccl, model and batches on cuda:0, a checkpoint round trip through a restart, the result."""
    trainer = TorchTrainer(
        gpu_regression,
        train_loop_config={"epochs": 6, "fail_after_epoch": 1},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
        run_config=RunConfig(
            name="gpu",
            storage_path=str(tmp_path),
            progress=False,
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    assert result.error is None
    m = result.metrics
    assert m is not None
    assert m["backend"] == "nccl"
    assert m["device"] == "cuda:0"
    assert m["param_device"] == "cuda:0"
    assert m["batch_device"] == "cuda:0"
    assert m["current_device"] == 0
    # Generation 1 resumed from generation 0's last checkpoint (epoch 1), loaded onto the GPU.
    assert m["generation"] == 1 and m["resumed_from"] == 2 and m["epoch"] == 5
    assert result.world_sizes == [1, 1]
    epochs = [h["epoch"] for h in result.metrics_history]
    assert epochs == [0, 1, 2, 3, 4, 5]
    losses = [h["loss"] for h in result.metrics_history]
    assert losses[-1] < losses[0] / 10, losses

    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"), map_location="cpu")
    assert state["epoch"] == 5
    model = nn.Linear(4, 1)
    model.load_state_dict(state["model"])
    assert model.weight.sum().item() == pytest.approx(m["weight_sum"], rel=1e-6)
    assert _mse_on_cpu(model) < _mse_on_cpu(nn.Linear(4, 1)) / 10


def ddp_gradients(config: dict[str, Any]) -> None:
    """Two ranks on two GPUs: DDP must all-reduce gradients of different shards to equal values."""
    import torch.distributed as dist

    ctx = torchjob.train.get_context()
    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)))
    loader = prepare_data_loader(DataLoader(_data(), batch_size=32, shuffle=False))
    xb, yb = next(iter(loader))
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grad) for _ in range(ctx.get_world_size())]
    dist.all_gather(gathered, grad)
    shards = [torch.empty_like(xb) for _ in range(ctx.get_world_size())]
    dist.all_gather(shards, xb.contiguous())
    torchjob.train.report(
        {
            "backend": dist.get_backend(),
            "devices": [str(xb.device), str(next(model.parameters()).device)],
            "max_grad_diff": max(float((g - gathered[0]).abs().max()) for g in gathered),
            "grad_norm": float(grad.norm()),
            "shards_differ": bool(not torch.equal(shards[0], shards[1])),
            "rank": ctx.get_world_rank(),
        }
    )
    if ctx.get_world_rank() == 1:
        Path(config["out"]).write_text(json.dumps({"device": str(xb.device)}))


def test_torch_trainer_two_gpus_ddp_gradients_agree(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / "rank1.json"
    result = TorchTrainer(
        ddp_gradients,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        run_config=RunConfig(name="ddp", storage_path=str(tmp_path), progress=False),
    ).fit()
    m = result.metrics
    assert m is not None
    assert m["backend"] == "nccl"
    assert m["devices"] == ["cuda:0", "cuda:0"]
    assert json.loads(out.read_text())["device"] == "cuda:1"
    assert m["shards_differ"] is True
    assert m["max_grad_diff"] == 0.0
    assert m["grad_norm"] > 0


def where_am_i() -> None:
    import torch.distributed as dist

    torchjob.train.report(
        {
            "cuda_available": torch.cuda.is_available(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device": str(get_device()),
            "backend": dist.get_backend(),
        }
    )


def test_cpu_workers_on_a_gpu_host_see_no_gpu(tmp_path: Path) -> None:
    """use_gpu=False: gloo on CPU, and (as in Ray) the workers do not see the GPUs."""
    result = TorchTrainer(
        where_am_i,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="cpu", storage_path=str(tmp_path), progress=False),
    ).fit()
    assert result.metrics == {
        "cuda_available": False,
        "visible": "",
        "device": "cpu",
        "backend": "gloo",
    }


def test_more_gpu_workers_than_gpus_fails_before_starting(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    trainer = TorchTrainer(
        where_am_i,
        scaling_config=ScalingConfig(num_workers=n + 1, use_gpu=True),
        run_config=RunConfig(name="too-many", storage_path=str(tmp_path), progress=False),
    )
    with pytest.raises(ValueError, match=rf"{n + 1} workers on this host, but {n} GPU"):
        trainer.fit()


# --- PyTorchTrainer (creator API) with use_fp16 on CUDA: torch.amp autocast + GradScaler ---


def amp_model_creator(config: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))


def amp_data_creator(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset]:
    data = _data(512)
    return data, _data(128)


def amp_optimizer_creator(model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.02))


def observing_train(
    config: dict[str, Any],
    model: nn.Module,
    train_iterator: Any,
    criterion: Any,
    optimizer: Any,
    scheduler: Any = None,
) -> dict[str, Any]:
    """The default train pass, plus what it ran with: autocast dtype, the scaler, devices."""
    from torchjob import sgd
    from torchjob.sgd.steps import get_context

    seen: dict[str, str] = {}

    def hook(_m: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        seen.setdefault("input_dtype", str(inputs[0].dtype))
        seen.setdefault("output_dtype", str(output.dtype))
        seen.setdefault("autocast_enabled", str(torch.is_autocast_enabled("cuda")))
        seen.setdefault("autocast_dtype", str(torch.get_autocast_dtype("cuda")))

    first_linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    handle = first_linear.register_forward_hook(hook)
    try:
        stats = sgd.default_train(config, model, train_iterator, criterion, optimizer, scheduler)
    finally:
        handle.remove()
    ctx = get_context()
    scaler = ctx.scaler
    param = next(model.parameters())
    stats.update(seen)
    stats.update(
        {
            "scaler": type(scaler).__name__,
            "scaler_device": getattr(scaler, "_device", "none"),
            "scale": float(scaler.get_scale()) if scaler is not None else -1.0,
            "param_device": str(param.device),
            "param_dtype": str(param.dtype),
            "grad_dtype": str(param.grad.dtype) if param.grad is not None else "none",
        }
    )
    return stats


def test_pytorch_trainer_fp16_on_cuda_uses_autocast_and_grad_scaler(tmp_path: Path) -> None:
    trainer = torchjob_sgd_trainer(
        train_function=observing_train,
        apex_args={"opt_level": "O1", "loss_scale": 128},
    )
    try:
        first = trainer.train()
        # Forward of the first Linear ran under fp16 autocast on cuda; parameters stay fp32.
        assert first["autocast_enabled"] == "True"
        assert first["autocast_dtype"] == "torch.float16"
        assert first["input_dtype"] == "torch.float32"
        assert first["output_dtype"] == "torch.float16"
        assert first["param_device"] == "cuda:0"
        assert first["param_dtype"] == "torch.float32"
        assert first["grad_dtype"] == "torch.float32"
        # A CUDA GradScaler, initialised from apex_args' loss_scale (no overflow: it stays).
        assert first["scaler"] == "GradScaler"
        assert first["scaler_device"] == "cuda"
        assert first["scale"] == 128.0
        for _ in range(4):
            last = trainer.train()
        assert last["epoch"] == 5
        assert last["train_loss"] < first["train_loss"] / 4, (first, last)
        val = trainer.validate()
        assert val["num_samples"] == 128
        assert val["val_loss"] < first["train_loss"]

        # The scaler's state is saved with the model and restored.
        path = trainer.save(tmp_path / "ckpt.pt")
        state = torch.load(path, map_location="cpu", weights_only=False)
        assert state["grad_scaler"]["scale"] == 128.0
        assert all(t.device.type == "cpu" for t in state["models"][0].values())
        trainer.restore(path)
        assert trainer.epoch == 5
        model = trainer.get_model()
        assert next(model.parameters()).device.type == "cpu"
        assert _mse_on_cpu(model) < first["train_loss"] / 4
    finally:
        trainer.shutdown()


def test_pytorch_trainer_fp16_default_functions_on_cuda() -> None:
    """The default train/validate functions with use_fp16 on a GPU: loss decreases, finite."""
    trainer = torchjob_sgd_trainer()
    try:
        losses = [trainer.train()["train_loss"] for _ in range(5)]
        assert all(loss == loss for loss in losses), losses  # no NaN from fp16
        assert losses[-1] < losses[0] / 4, losses
        val = trainer.validate()
        assert val["val_loss"] < losses[0]
    finally:
        trainer.shutdown()


def torchjob_sgd_trainer(**kwargs: Any) -> Any:
    from torchjob.sgd import PyTorchTrainer

    return PyTorchTrainer(
        amp_model_creator,
        amp_data_creator,
        amp_optimizer_creator,
        loss_creator=nn.MSELoss,
        config={"lr": 0.02},
        num_replicas=1,
        use_gpu=True,
        use_fp16=True,
        batch_size=32,
        **kwargs,
    )
