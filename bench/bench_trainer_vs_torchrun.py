"""Time to first training step and steps/second: torchjob's TorchTrainer vs hand-written DDP under torchrun.

Same model, same synthetic data, same number of processes, gloo on CPU, run side
by side on this machine. Prints figures and ratios; asserts nothing.

    python bench/bench_trainer_vs_torchrun.py [--workers 2] [--steps 200] [--repeats 2]

``--gpu``: nccl, model and data on CUDA, one worker per visible GPU, a model big
enough for the GPU to matter (MLP of ``--width`` 4096, ``--layers`` 4, batch 256,
bf16 autocast or ``--dtype fp32``); the timings synchronize the GPU.

    python bench/bench_trainer_vs_torchrun.py --gpu [--steps 300] [--repeats 3] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from torchjob.launch import malloc

# The training step both sides run, kept in one place so they cannot drift apart.
STEP_CODE = textwrap.dedent(
    """
    import time, json, torch
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 10))
        x = torch.randn(64, 256)
        y = torch.randint(0, 10, (64,))
        return model, x, y
    def loop(model, x, y, steps, warmup, out_path, rank):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        first = None
        for i in range(steps + warmup):
            if i == warmup:
                t_warm = time.time()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            if first is None:
                first = time.time()
        elapsed = time.time() - t_warm
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({"first_step_at": first, "steps_per_s": steps / elapsed}, f)
    """
)

TORCHRUN_SCRIPT = STEP_CODE + textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo")
    model, x, y = make()
    loop(DistributedDataParallel(model), x, y, int(sys.argv[2]), 10, sys.argv[1], dist.get_rank())
    dist.destroy_process_group()
    """
)


# --gpu: the same comparison on CUDA (nccl), with a model the GPU has work to do for.
GPU_STEP_CODE = textwrap.dedent(
    """
    import time, json, torch
    def make(width, layers, batch, device):
        torch.manual_seed(0)
        mods = []
        for _ in range(layers):
            mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*mods, torch.nn.Linear(width, 10))
        g = torch.Generator().manual_seed(1)
        x = torch.randn(batch, width, generator=g).to(device)
        y = torch.randint(0, 10, (batch,), generator=g).to(device)
        return model, x, y
    def loop(model, x, y, steps, warmup, out_path, rank, dtype):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        first = None
        for i in range(steps + warmup):
            if i == warmup:
                torch.cuda.synchronize()
                t_warm = time.time()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
            if first is None:
                torch.cuda.synchronize()
                first = time.time()
        torch.cuda.synchronize()
        elapsed = time.time() - t_warm
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({"first_step_at": first, "steps_per_s": steps / elapsed,
                           "loss": float(loss), "device": torch.cuda.get_device_name()}, f)
    """
)

GPU_TORCHRUN_SCRIPT = GPU_STEP_CODE + textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    width, layers, batch, dtype = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    model, x, y = make(width, layers, batch, local_rank)
    model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])
    loop(model, x, y, int(sys.argv[2]), 10, sys.argv[1], dist.get_rank(), dtype)
    dist.destroy_process_group()
    """
)

GPU_TORCHJOB_SCRIPT = GPU_STEP_CODE + textwrap.dedent(
    """
    import sys, time
    import torchjob.train
    from torchjob.train import RunConfig, ScalingConfig
    from torch.nn.parallel import DistributedDataParallel
    from torchjob.train.torch import TorchTrainer, get_device, prepare_model

    def train_func(config):
        model, x, y = make(config["width"], config["layers"], config["batch"], get_device())
        model = prepare_model(model)
        if config["ddp"] and not isinstance(model, DistributedDataParallel):
            model = DistributedDataParallel(model, device_ids=[get_device()])
        rank = torchjob.train.get_context().get_world_rank()
        loop(model, x, y, config["steps"], 10, config["out"], rank, config["dtype"])
        torchjob.train.report({"done": 1})

    TorchTrainer(
        train_func,
        train_loop_config={"steps": int(sys.argv[2]), "out": sys.argv[1], "width": int(sys.argv[5]),
                           "layers": int(sys.argv[6]), "batch": int(sys.argv[7]), "dtype": sys.argv[8],
                           "ddp": sys.argv[9] == "ddp"},
        scaling_config=ScalingConfig(num_workers=int(sys.argv[3]), use_gpu=True),
        run_config=RunConfig(storage_path=sys.argv[4], progress=False),
    ).fit()
    """
)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    """Run one side; on failure show the end of its stderr (the figures need both sides)."""
    proc = subprocess.run(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    if proc.returncode:
        print(proc.stderr[-4000:], file=sys.stderr)
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def run_torchrun(
    workers: int,
    steps: int,
    tmp: Path,
    script_text: str = TORCHRUN_SCRIPT,
    extra: tuple[str, ...] = (),
) -> dict[str, float]:
    script = tmp / "ddp_script.py"
    script.write_text(script_text)
    out = tmp / "torchrun.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={workers}", str(script), str(out), str(steps), *extra,
    ]  # fmt: skip
    t0 = time.time()
    # torchjob's workers fix glibc malloc's thresholds themselves; torchrun's get the same
    # as variables, so the sides differ by the trainer, not the allocator.
    _run(cmd, {**os.environ, **malloc.glibc_env()})
    total = time.time() - t0
    data = json.loads(out.read_text())
    return {
        "first_step_s": data["first_step_at"] - t0,
        "steps_per_s": data["steps_per_s"],
        "total_s": total,
    }


TORCHJOB_SCRIPT = STEP_CODE + textwrap.dedent(
    """
    import sys, time
    t0 = time.time()
    import torchjob.train
    from torchjob.train import RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer, prepare_model

    def train_func(config):
        model, x, y = make()
        model = prepare_model(model)
        loop(model, x, y, config["steps"], 10, config["out"], torchjob.train.get_context().get_world_rank())
        torchjob.train.report({"done": 1})

    TorchTrainer(
        train_func,
        train_loop_config={"steps": int(sys.argv[2]), "out": sys.argv[1]},
        scaling_config=ScalingConfig(num_workers=int(sys.argv[3])),
        run_config=RunConfig(storage_path=sys.argv[4], progress=False),
    ).fit()
    """
)


def run_torchjob(
    workers: int,
    steps: int,
    tmp: Path,
    script_text: str = TORCHJOB_SCRIPT,
    extra: tuple[str, ...] = (),
) -> dict[str, float]:
    script = tmp / "torchjob_script.py"
    script.write_text(script_text)
    out = tmp / "torchjob.json"
    t0 = time.time()
    cmd = [
        sys.executable, str(script), str(out), str(steps), str(workers), str(tmp / "runs"), *extra,
    ]  # fmt: skip
    _run(cmd)
    total = time.time() - t0
    data = json.loads(out.read_text())
    return {
        "first_step_s": data["first_step_at"] - t0,
        "steps_per_s": data["steps_per_s"],
        "total_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="nccl, one worker per visible GPU")
    parser.add_argument("--width", type=int, default=4096, help="--gpu: MLP width")
    parser.add_argument("--layers", type=int, default=4, help="--gpu: hidden layers")
    parser.add_argument("--batch", type=int, default=256, help="--gpu: batch per worker")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="--gpu: autocast")
    parser.add_argument(
        "--ddp-at-one-worker",
        action="store_true",
        help="--gpu: the torchjob side wraps DDP even at 1 worker (the torchrun script's graph)",
    )
    args = parser.parse_args()
    if args.gpu:
        return main_gpu(args)
    env_threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"TorchTrainer vs torchrun+DDP: {args.workers} workers, gloo/CPU, {args.steps} steps "
        f"(MLP 256-512-512-10, batch 64), {args.repeats} alternating repeats, OMP_NUM_THREADS={env_threads}"
    )
    runs: dict[str, list[dict[str, float]]] = {"torchrun": [], "torchjob": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for _ in range(args.repeats):
            runs["torchrun"].append(run_torchrun(args.workers, args.steps, tmp))
            runs["torchjob"].append(run_torchjob(args.workers, args.steps, tmp))
    _print_table(runs)


def main_gpu(args: argparse.Namespace) -> None:
    import torch

    if not torch.cuda.is_available():
        print("--gpu: no CUDA device visible (torch.cuda.is_available() is False); nothing to run")
        return
    workers = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    print(
        f"TorchTrainer vs torchrun+DDP on GPU: {workers} worker(s) (one per GPU, {name}), nccl, "
        f"{args.steps} steps after 10 warm-up, MLP {args.layers}x{args.width} (+{args.width}->10), "
        f"batch {args.batch}/worker, {args.dtype}, {args.repeats} alternating repeats"
    )
    wrap = args.ddp_at_one_worker
    print(
        "  torchrun side: hand-written DDP (always wrapped); torchjob side: prepare_model"
        + (", then DDP at 1 worker too" if wrap else " (no DDP wrapper at 1 worker, as Ray Train)")
    )
    shape = (str(args.width), str(args.layers), str(args.batch), args.dtype)
    torchjob_args = (*shape, "ddp" if wrap else "auto")
    runs: dict[str, list[dict[str, float]]] = {"torchrun": [], "torchjob": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for _ in range(args.repeats):
            runs["torchrun"].append(
                run_torchrun(workers, args.steps, tmp, GPU_TORCHRUN_SCRIPT, shape)
            )
            runs["torchjob"].append(
                run_torchjob(workers, args.steps, tmp, GPU_TORCHJOB_SCRIPT, torchjob_args)
            )
    for side, rs in runs.items():
        each = ", ".join(f"{r['first_step_s']:.2f}s/{r['steps_per_s']:.1f}" for r in rs)
        print(f"  {side} runs (first step / steps per s): {each}")
    _print_table(runs)


def _print_table(runs: dict[str, list[dict[str, float]]]) -> None:
    med: dict[str, dict[str, Any]] = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    print(f"{'':10}{'first step (s)':>16}{'steps/s':>12}{'total (s)':>12}")
    for name in ("torchrun", "torchjob"):
        m = med[name]
        print(f"{name:10}{m['first_step_s']:>16.2f}{m['steps_per_s']:>12.1f}{m['total_s']:>12.2f}")
    tr, tj = med["torchrun"], med["torchjob"]
    print(
        f"ratios torchjob/torchrun: first step x{tj['first_step_s'] / tr['first_step_s']:.2f}, "
        f"steps/s x{tj['steps_per_s'] / tr['steps_per_s']:.2f}, total x{tj['total_s'] / tr['total_s']:.2f}"
    )


if __name__ == "__main__":
    main()
