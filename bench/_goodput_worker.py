"""The workload of bench/goodput.py: fixed-cost steps written the way docs/runtime.md tells
users to write a training loop (checkpoint every N steps and on ``should_stop()``).

    python bench/_goodput_worker.py EVENTS STEP_SECONDS CKPT_EVERY MAX_STEPS BATCH [--restore-point]
                                    [--state-mib N]

``--state-mib N``: N MiB of model and Adam state (bench/_goodput_state.py) instead of the tiny
``Linear(16, 1)``; every step touches all of it.

``--restore-point``: the loop docs/runtime.md gives for a hard loss: the state is handed to
the runtime with ``register_state`` and every step reports, so the survivors of a SIGKILLed
pod resume from the last step in their memory (``restored`` then says ``source: memory``);
the storage checkpoint every CKPT_EVERY steps stays the fallback for losing every replica.
With it, a notice that names every rank (``get_preemption_info()``: all the job's nodes
noticed at once, so no survivor will hold the restore point if the replacements come late)
takes a storage checkpoint at once, as docs/runtime.md's notice loop does.

Appends one JSON line per event to EVENTS (a file on the storage every pod shares): ``start``
(before any import), ``imported`` (torch and torchjob.train imported), ``group`` (inside the
training function: the process group is formed), ``restored`` (checkpoint loaded), ``step``
(rank 0, every step) and ``commit`` (rank 0, after a checkpoint committed). Every line carries
the wall clock, the pod, the rank and the generation, so the benchmark can cut a recovery
into phases. ``samples`` counts the samples the job's lineage processed (world size x BATCH
per step), kept in the checkpoint, so it is exact across world sizes.
"""

from __future__ import annotations

import time

T0 = time.time()

import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from _goodput_events import Events  # noqa: E402  (the standard library only: T0 stays first)

emit = Events(sys.argv[1]).emit
emit("start", t_start=T0)

import torch  # noqa: E402

import _goodput_state  # noqa: E402  (imports torch)
from torchjob.train import (  # noqa: E402
    Checkpoint,
    RunConfig,
    ScalingConfig,
    get_checkpoint,
    get_context,
    get_preemption_info,
    register_state,
    report,
    should_stop,
)
from torchjob.train.torch import TorchTrainer, prepare_model  # noqa: E402

emit("imported")


def train_func(config: dict[str, float]) -> None:
    ctx = get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    emit("group", rank=rank, world=world)
    torch.manual_seed(0)
    mib = int(config["state_mib"])
    module, x = _goodput_state.build(mib, int(config["batch"]))
    model = prepare_model(module)
    emit("model", rank=rank, world=world)  # DDP built (its constructor imports torch._dynamo)
    opt = _goodput_state.optimizer(mib, model.parameters())
    state: dict[str, object] = {"model": model, "opt": opt, "step": 0, "samples": 0}
    in_memory = bool(config["restore_point"])
    source = "start"
    if in_memory and register_state(state, in_place=bool(config["in_place"])):
        source = "memory"  # the survivors' memory: storage is not read
    elif (ckpt := get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"))
        getattr(model, "module", model).load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state["step"], state["samples"] = saved["step"], saved["samples"]
        source = "storage"
    step, samples = int(state["step"]), int(state["samples"])  # type: ignore[call-overload]
    emit("restored", rank=rank, world=world, step=step, samples=samples, source=source)
    batch = int(config["batch"])
    saved_for_notice = False
    while step < config["max_steps"]:
        if get_context().get_generation() != ctx.get_generation():
            # Re-formed in place (register_state(in_place=True)) inside the last
            # should_stop(): the state was rolled back under the loop, the world changed.
            ctx = get_context()
            rank, world = ctx.get_world_rank(), ctx.get_world_size()
            step, samples = int(state["step"]), int(state["samples"])  # type: ignore[call-overload]
            emit("group", rank=rank, world=world)
            emit("model", rank=rank, world=world)
            emit("restored", rank=rank, world=world, step=step, samples=samples, source="memory")
        time.sleep(config["step_seconds"])  # the fixed cost of a step
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        samples += batch * world
        state["step"], state["samples"] = step, samples
        if rank == 0:
            emit("step", rank=rank, world=world, step=step, samples=samples)
        stop = should_stop()
        # A collective: every rank asks, every step (None outside a notice).
        notice = get_preemption_info() if in_memory else None
        everyone = notice is not None and len(notice.ranks) >= world and not saved_for_notice
        saved_for_notice = saved_for_notice or everyone
        due = stop or everyone or step % int(config["ckpt_every"]) == 0
        due = due or step >= config["max_steps"]
        metrics = {"step": step, "samples": samples}
        if due and rank == 0:
            with tempfile.TemporaryDirectory() as d:
                saved = {
                    "model": getattr(model, "module", model).state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                    "samples": samples,
                }
                torch.save(saved, os.path.join(d, "state.pt"))
                report(metrics, checkpoint=Checkpoint.from_directory(d))
            emit("commit", rank=rank, world=world, step=step, samples=samples)
        elif due or in_memory:
            report(metrics)  # with a restore point: every step, the restore point taken
        if stop:
            return


if __name__ == "__main__":
    step_seconds, ckpt_every = float(sys.argv[2]), int(sys.argv[3])
    max_steps, batch = int(sys.argv[4]), int(sys.argv[5])
    restore_point = "--restore-point" in sys.argv[6:]
    in_place = "--in-place" in sys.argv[6:]
    TorchTrainer(
        train_func,
        train_loop_config={
            "step_seconds": step_seconds,
            "ckpt_every": ckpt_every,
            "max_steps": max_steps,
            "batch": batch,
            "restore_point": restore_point,
            "in_place": in_place,
            "state_mib": _goodput_state.state_mib(),
        },
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="goodput"),
    ).fit()
