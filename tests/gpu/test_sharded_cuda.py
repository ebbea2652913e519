"""Sharded checkpoints on CUDA with NCCL: an FSDP2 model on every visible GPU saves its
``TrainState`` asynchronously (staged into pinned host memory, written by a background thread
over a gloo group of its own), a second run resumes from it on the GPUs, and one CPU process
loads the same checkpoint without a process group: every tensor equal.

Skipped where ``torch.cuda.is_available()`` is False (CI, laptops). On a GPU machine:

    python -m pytest tests/gpu/test_sharded_cuda.py -m gpu -v
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tests.gpu_marks import NEEDS_GPU

from torchjob.train import CheckpointConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer

pytestmark = NEEDS_GPU


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def _train(config: dict[str, Any]) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from torchjob.train import Checkpoint, TrainState, get_checkpoint, get_context, report
    from torchjob.train.torch import get_device

    device = get_device()
    assert device.type == "cuda" and dist.get_backend() == "nccl"
    model = _model().to(device)
    fully_shard(model)  # FSDP2 even on one GPU: the state is DTensor shards on cuda
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = TrainState(model, opt)
    resumed = -1
    if (ckpt := get_checkpoint()) is not None:
        ckpt.load_state(state)
        resumed = state.step
    for _ in range(config["steps"]):
        model(torch.randn(16, 32, device=device)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        state.step += 1
        report({"step": state.step, "resumed": resumed}, checkpoint=Checkpoint.from_state(state))
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if get_context().get_world_rank() == 0:
        torch.save(full, config["out"])


def _fit(tmp_path: Path, steps: int, out: str) -> Any:
    return TorchTrainer(
        _train,
        train_loop_config={"steps": steps, "out": str(tmp_path / out)},
        scaling_config=ScalingConfig(num_workers=torch.cuda.device_count(), use_gpu=True),
        run_config=RunConfig(
            name="cuda-sharded",
            storage_path=str(tmp_path),
            progress=False,
            checkpoint_config=CheckpointConfig(async_commit=True),
        ),
    ).fit()


def test_fsdp2_sharded_async_checkpoint_on_cuda_resumes_and_loads_on_cpu(tmp_path: Path) -> None:
    from torchjob.train import TrainState

    first = _fit(tmp_path, 3, "first.pt")
    assert first.error is None and first.metrics["step"] == 3
    second = _fit(tmp_path, 1, "second.pt")
    assert second.metrics_history[0]["resumed"] == 3 and second.metrics["step"] == 4

    cpu = _model()
    assert second.checkpoint is not None and second.checkpoint.is_sharded
    second.checkpoint.load_state(TrainState(cpu, rng=False))  # one CPU process, no group
    saved = torch.load(tmp_path / "second.pt")
    for name, tensor in cpu.state_dict().items():
        assert torch.equal(tensor, saved[name].cpu()), name
