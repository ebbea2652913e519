"""The workload of bench/goodput.py for Kubeflow's PyTorchJob: the same fixed-cost steps as
bench/_goodput_worker.py, written as a torchrun user writes them (plain torch.distributed,
no torchjob): a checkpoint every CKPT_EVERY steps and when any rank got SIGTERM (the flag is
all-reduced every step, so rank 0 saves even when another pod is the one evicted), then the
signalled processes leave and the others carry on until torchrun re-forms the group.

    python3 bench/_goodput_torchrun.py --torchrun bench/_goodput_torchrun.py \
        EVENTS STEP_SECONDS CKPT_EVERY MAX_STEPS BATCH [--state-mib N]  # torchrun's from PET_*

It emits the same events as bench/_goodput_worker.py. Kubeflow has no generation number: the
group's rank 0 counts the groups it formed in ``generation`` beside the checkpoint (a shared
hostPath) and broadcasts it, so a recovery is "a step of a later group" here too.
"""

from __future__ import annotations

import time

T0 = time.time()

import sys  # noqa: E402


def _without_libuv() -> None:
    """The image's torch (Debian's python3-torch) is built without libuv, and torchrun's c10d
    rendezvous and the workers' agent-store client create TCPStores with libuv's default
    (on): turn that one default off, in the agent and in the workers. Nothing else."""
    import importlib

    import torch.distributed as dist
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend

    # The module, not the function torch.distributed.rendezvous that shadows its name.
    rendezvous = importlib.import_module("torch.distributed.rendezvous")

    class _Store(dist.TCPStore):  # type: ignore[misc,name-defined]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    for module in (dist, c10d_backend, rendezvous):
        module.TCPStore = _Store  # type: ignore[attr-defined]


if len(sys.argv) > 1 and sys.argv[1] == "--torchrun":
    from torch.distributed.run import main as torchrun

    _without_libuv()
    torchrun(sys.argv[2:])
    sys.exit(0)

import os  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

from _goodput_events import Events  # noqa: E402  (the standard library only: T0 stays first)

EVENTS = Path(sys.argv[1])
STORE = EVENTS.parent / "checkpoints"
GEN_FILE = STORE / "generation"


def _read_gen() -> int:
    try:
        return int(GEN_FILE.read_text())
    except (OSError, ValueError):
        return -1


# The group this process expects to join; rank 0 settles it in main().
events = Events(EVENTS, gen=_read_gen() + 1)
emit = events.emit
emit("start", t_start=T0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import _goodput_state  # noqa: E402  (imports torch; --state-mib)

_without_libuv()
emit("imported")

stop_requested = False


def on_sigterm(_signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    step_seconds, ckpt_every = float(sys.argv[2]), int(sys.argv[3])
    max_steps, batch = int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.tensor([0])
    if rank == 0:
        gen[0] = _read_gen() + 1
        tmp = GEN_FILE.with_suffix(".tmp")
        tmp.write_text(str(int(gen[0])))
        os.replace(tmp, GEN_FILE)
    dist.broadcast(gen, 0)
    events.gen = int(gen[0])
    emit("group", rank=rank, world=world)
    torch.manual_seed(0)
    mib = _goodput_state.state_mib()
    module, x = _goodput_state.build(mib, batch)
    model = torch.nn.parallel.DistributedDataParallel(module)
    emit("model", rank=rank, world=world)
    opt = _goodput_state.optimizer(mib, model.parameters())
    step, samples = 0, 0
    path = STORE / "state.pt"
    if path.exists():
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, samples = state["step"], state["samples"]
    emit("restored", rank=rank, world=world, step=step, samples=samples)
    while step < max_steps:
        time.sleep(step_seconds)  # the fixed cost of a step
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        samples += batch * world
        if rank == 0:
            emit("step", rank=rank, world=world, step=step, samples=samples)
        flag = torch.tensor([1 if stop_requested else 0])
        dist.all_reduce(flag)
        stop = bool(flag.item())
        if stop or step % ckpt_every == 0:
            if rank == 0:
                state = {
                    "model": model.module.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                    "samples": samples,
                }
                tmp = STORE / "state.pt.tmp"
                torch.save(state, tmp)
                os.replace(tmp, path)  # atomic: a reader sees the old or the new one
                emit("commit", rank=rank, world=world, step=step, samples=samples)
            dist.barrier()
        if stop and stop_requested:
            return  # this pod is going away; the others carry on until torchrun re-forms


if __name__ == "__main__":
    main()
