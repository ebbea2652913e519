"""DDP's init broadcast after a restore from memory (issue 39: a re-formation's cost).

Real gloo workers on this machine. When a generation resumes from the survivors' memory,
every rank loads the same restore point, so ``prepare_model`` builds DDP without its init
broadcast of the parameters from rank 0 (``init_sync=False``). Should the loop not load the
restore point into the model, the first forward broadcasts rank 0's parameters instead: the
ranks never train from different ones. Each generation-1 model here starts from a seed of its
own rank, so any rank left unsynced would end with parameters of its own.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import torchjob.train
from torchjob.train import FailureConfig, RunConfig, ScalingConfig, _session
from torchjob.train.torch import TorchTrainer, prepare_model

WORLD = 3
STEPS = 6
LOSE_AT = 3


def loop(config: dict[str, Any]) -> None:
    ctx = torchjob.train.get_context()
    rank, generation = ctx.get_world_rank(), ctx.get_generation()
    torch.manual_seed(rank if generation > 0 else 0)  # generation 1: every rank differs
    model = prepare_model(torch.nn.Linear(4, 1))
    session = _session.current()
    assert session is not None
    deferred = any(m is model for m in session.unsynced)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state: dict[str, Any] = {"step": 0, "optimizer": opt}
    if config["register_model"]:
        state["model"] = model
    restored = torchjob.train.register_state(state)
    log = Path(config["dir"]) / f"gen{generation}-rank{rank}.json"
    log.write_text(json.dumps({"deferred": deferred, "restored": restored}))
    while state["step"] < STEPS:
        step = state["step"] + 1
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        state["step"] = step
        torchjob.train.report({"step": step})
        if generation == 0 and step == LOSE_AT and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save(params, Path(config["dir"]) / f"final-rank{rank}.pt")


@pytest.mark.parametrize("register_model", [True, False], ids=["model-restored", "not-restored"])
def test_a_restored_generation_skips_ddps_broadcast_and_the_ranks_stay_equal(
    tmp_path: Path, register_model: bool
) -> None:
    trainer = TorchTrainer(
        loop,
        train_loop_config={"dir": str(tmp_path), "register_model": register_model},
        scaling_config=ScalingConfig(num_workers=WORLD),
        run_config=RunConfig(
            name="ddp-sync",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    )
    result = trainer.fit()
    assert result.error is None
    assert [m["step"] for m in result.metrics_history][-1] == STEPS
    for generation, deferred in ((0, False), (1, True)):
        logs = [
            json.loads((tmp_path / f"gen{generation}-rank{r}.json").read_text())
            for r in range(WORLD)
        ]
        assert all(log["deferred"] == deferred for log in logs), (generation, logs)
        assert all(log["restored"] == (generation == 1) for log in logs), (generation, logs)
    finals = [torch.load(tmp_path / f"final-rank{r}.pt") for r in range(WORLD)]
    for f in finals[1:]:
        assert torch.equal(f, finals[0])


def _construct(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from torchjob.train._ddp import without_init_broadcast

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    inside, outside = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    with without_init_broadcast():
        DistributedDataParallel(inside)
    DistributedDataParallel(outside)
    torch.save([inside.weight.detach(), outside.weight.detach()], f"{out}-{rank}.pt")
    dist.destroy_process_group()


def test_without_init_broadcast_stands_down_ddps_broadcast_only_inside(tmp_path: Path) -> None:
    """The stand-in for a torch whose DDP has no ``init_sync`` (the CPU image's 2.6): two
    real gloo ranks, each model from a seed of its own; built inside the context each keeps
    its own parameters, built after it both get rank 0's. Torch is left as it was."""
    from torch.nn.parallel import distributed

    before = distributed._sync_module_states
    out = str(tmp_path / "w")
    # Spawned: forking this process (pytest's, with its threads) could copy a lock some
    # thread holds, and a child would hang on it; each child imports torch again instead.
    torch.multiprocessing.start_processes(
        _construct, args=(str(tmp_path / "init"), out), nprocs=2, start_method="spawn"
    )
    (in0, out0), (in1, out1) = torch.load(f"{out}-0.pt"), torch.load(f"{out}-1.pt")
    assert not torch.equal(in0, in1), "inside: no broadcast"
    assert torch.equal(out0, out1), "after it: DDP's broadcast as usual"
    assert distributed._sync_module_states is before
