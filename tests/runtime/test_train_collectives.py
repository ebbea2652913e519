"""DDP through prepare_model on real processes: ranks agree on gradients and parameters; bf16 autocast."""

from __future__ import annotations

import hashlib

import torch

from torchjob.launch import WorkerGroup, worker_info
from torchjob.train.torch import prepare_data_loader, prepare_model


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def _train_steps(autocast_bf16: bool) -> dict[str, object]:
    info = worker_info()
    assert info is not None
    torch.manual_seed(info.rank)  # different init per rank: DDP must broadcast rank 0's
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(
        torch.randn(96, 8, generator=torch.Generator().manual_seed(0)), torch.arange(96) % 2
    )
    loader = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True))
    first_batches = []
    grads = ""
    losses = []
    for x, y in loader:
        first_batches.append(x[0, 0].item())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
        opt.zero_grad()
        loss.backward()
        grads = _digest([p.grad for p in model.parameters() if p.grad is not None])
        opt.step()
        losses.append(loss.item())
    return {
        "params": _digest(list(model.parameters())),
        "grads": grads,
        "batches": first_batches,
        "finite": all(torch.isfinite(torch.tensor(losses))),
    }


def test_gradients_and_parameters_identical_across_ranks(group3: WorkerGroup) -> None:
    results = group3.execute(_train_steps, False)
    assert len({r["grads"] for r in results}) == 1
    assert len({r["params"] for r in results}) == 1
    # ...while each rank saw different data (its own shard).
    assert len({tuple(r["batches"]) for r in results}) == 3  # type: ignore[arg-type]


def test_bf16_autocast_path(group3: WorkerGroup) -> None:
    results = group3.execute(_train_steps, True)
    assert all(r["finite"] for r in results)
    assert len({r["params"] for r in results}) == 1


def _fsdp_steps() -> list[float]:
    torch.manual_seed(0)
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)),
        parallel_strategy="fsdp",
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_fsdp_option_trains_on_cpu(group3: WorkerGroup) -> None:
    results = group3.execute(_fsdp_steps)
    assert results[0] == results[1] == results[2]  # same data, sharded params: same losses
    assert results[0][-1] < results[0][0]
