"""The FSDP2 workload of bench/goodput.py (``--strategy fsdp``): the same fixed-cost steps,
events and checkpoint cadence as bench/_goodput_worker.py, but the model is sharded with
``prepare_model(parallel_strategy="fsdp")`` (FSDP2 ``fully_shard``) and every rank writes its
own shards at each checkpoint (``TrainState`` + ``Checkpoint.from_state``, DCP), as
examples/finetune_fsdp does. A resume, at any world size, loads the shards resharded.

    python bench/_goodput_fsdp_worker.py EVENTS STEP_SECONDS CKPT_EVERY MAX_STEPS BATCH

The step time is the same fixed sleep as the DDP worker's, so a row pair (``--strategy ddp``
and ``--strategy fsdp``) compares what each costs under the same storm, not their compute.
"""

from __future__ import annotations

import time

T0 = time.time()

import sys  # noqa: E402

from _goodput_events import Events  # noqa: E402  (the standard library only: T0 stays first)

emit = Events(sys.argv[1]).emit
emit("start", t_start=T0)

import torch  # noqa: E402
import torch.distributed.checkpoint  # noqa: E402  (imported before the group forms)
import torch.distributed.fsdp  # noqa: E402

from torchjob.train import (  # noqa: E402
    Checkpoint,
    RunConfig,
    ScalingConfig,
    TrainState,
    get_checkpoint,
    get_context,
    report,
    should_stop,
)
from torchjob.train.torch import TorchTrainer, prepare_model  # noqa: E402

emit("imported")


def train_func(config: dict[str, float]) -> None:
    ctx = get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    emit("group", rank=rank, world=world)
    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = prepare_model(model, parallel_strategy="fsdp")  # FSDP2 at > 1 worker
    emit("model", rank=rank, world=world)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = TrainState(model, opt, extra={"samples": 0})
    ckpt = get_checkpoint()
    if ckpt is not None:
        ckpt.load_state(state)  # every rank reads its shards, resharded to this world size
    emit("restored", rank=rank, world=world, step=state.step, samples=state.extra["samples"])
    batch = int(config["batch"])
    x = torch.randn(batch, 16)
    while state.step < config["max_steps"]:
        time.sleep(config["step_seconds"])  # the fixed cost of a step
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state.step += 1
        state.extra["samples"] += batch * world
        step, samples = state.step, state.extra["samples"]
        if rank == 0:
            emit("step", rank=rank, world=world, step=step, samples=samples)
        stop = should_stop()
        if stop or step % int(config["ckpt_every"]) == 0 or step >= config["max_steps"]:
            # Collective: every rank writes its own shards (asynchronously by default).
            report({"step": step, "samples": samples}, checkpoint=Checkpoint.from_state(state))
            if rank == 0:
                emit("commit", rank=rank, world=world, step=step, samples=samples)
        if stop:
            return


if __name__ == "__main__":
    step_seconds, ckpt_every = float(sys.argv[2]), int(sys.argv[3])
    max_steps, batch = int(sys.argv[4]), int(sys.argv[5])
    TorchTrainer(
        train_func,
        train_loop_config={
            "step_seconds": step_seconds,
            "ckpt_every": ckpt_every,
            "max_steps": max_steps,
            "batch": batch,
        },
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="goodput"),
    ).fit()
